// Wrapper module: kwok and kwokctl v0.7.0.
module kubeforge.local/e2e/build/kwok

go 1.24.0

require sigs.k8s.io/kwok v0.7.0
