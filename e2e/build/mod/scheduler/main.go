// Command kube-scheduler is the upstream kube-scheduler v1.34.10 with the
// Coscheduling (gang) plugin of sigs.k8s.io/scheduler-plugins registered.
// Built by e2e/build/build.sh; configured by the KubeSchedulerConfiguration
// that e2e/kfcluster writes (Coscheduling in multiPoint and as queueSort).
package main

import (
	"os"

	"k8s.io/component-base/cli"
	_ "k8s.io/component-base/metrics/prometheus/clientgo" // rest client metrics
	_ "k8s.io/component-base/metrics/prometheus/version"  // version metric
	"k8s.io/kubernetes/cmd/kube-scheduler/app"

	// Registers CoschedulingArgs and the other plugin args with the config scheme.
	_ "sigs.k8s.io/scheduler-plugins/apis/config/scheme"
	"sigs.k8s.io/scheduler-plugins/pkg/coscheduling"
)

func main() {
	command := app.NewSchedulerCommand(
		app.WithPlugin(coscheduling.Name, coscheduling.New),
	)
	os.Exit(cli.Run(command))
}
