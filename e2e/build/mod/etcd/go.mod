// Wrapper module: etcd v3.6.14 (server/v3 has relative replace directives, so it
// cannot be go-installed; the etcd main package lives at go.etcd.io/etcd/server/v3).
module kubeforge.local/e2e/build/etcd

go 1.25.0

require go.etcd.io/etcd/server/v3 v3.6.14
