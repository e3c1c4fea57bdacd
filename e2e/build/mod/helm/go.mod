// Wrapper module: helm v3.19.5.
module kubeforge.local/e2e/build/helm

go 1.24.0

require helm.sh/helm/v3 v3.19.5
