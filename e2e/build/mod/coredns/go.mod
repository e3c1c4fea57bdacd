// Wrapper module: CoreDNS v1.15.0 (cluster DNS for the real node, issue 6).
module kubeforge.local/e2e/build/coredns

go 1.26.0

require github.com/coredns/coredns v1.15.0
