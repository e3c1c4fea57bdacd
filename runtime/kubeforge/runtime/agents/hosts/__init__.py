"""Where environment steps run: ``host`` (the ``EnvironmentHost`` interface, the outcome rules, ``InProcessHost``),
``workers`` (``SubprocessHost``: a pool of ``worker`` processes talking ``pipe`` frames), ``remote_host``
(``RemoteHost``: the verifiers' environment servers) and ``env_server`` (a verifier's server over a
``SubprocessHost``); those two talk through ``runtime.rpc``'s channels, injected.

No face: a worker process (``python -m kubeforge.runtime.agents.hosts.worker``) imports this package, and must not pull
in ZeroMQ or the pool; callers import the module they use."""
