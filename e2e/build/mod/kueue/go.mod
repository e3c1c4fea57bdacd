// Wrapper module: Kueue v0.17.0's manager (cmd/kueue), the job queueing controller the RLJob integration is tested
// against (e2e/test_kueue.py). Its own go.mod has no replace directives; this module only pins the version.
module kubeforge.local/e2e/build/kueue

go 1.25.0

require sigs.k8s.io/kueue v0.17.0
