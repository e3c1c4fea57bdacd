"""Sandboxes from the cluster (``spec.sandbox``; docs/sandboxes.md): a warm pool of sandbox pods where model-written
programs run, one lease per episode. ``protocol`` (the messages, checked field by field), ``server`` (a sandbox
pod's process: slots, leases, runs, resets), ``client`` (what CodeFeedback and CodeExecution claim with), ``start``
(``kubeforge role sandbox``)."""
