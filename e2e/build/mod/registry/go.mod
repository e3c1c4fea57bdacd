// Wrapper module: the CNCF distribution registry v3.0.0 (the OCI registry `make images REGISTRY=...` is tested
// against: e2e/test_images_push.py).
module kubeforge.local/e2e/build/registry

go 1.23.7

require github.com/distribution/distribution/v3 v3.0.0
