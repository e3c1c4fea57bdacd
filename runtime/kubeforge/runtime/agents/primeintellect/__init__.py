"""``spec.environment.type: Verifiers``: environments written for PrimeIntellect's ``verifiers`` library, run
unchanged by the library's own rollout loop against the endpoint (docs/agents-endpoint.md).

Named after the library's maker, not the library, so that "verifiers" keeps one meaning in this package's
neighbourhood: ``runtime/verifiers/`` are the reward functions and ``verifier/`` the role.

``adapter`` (our side: open episodes, start the runner, pair rewards with recordings), ``runner`` (the library's
side: a script the environments' interpreter runs by path; standard library and ``verifiers`` only, never this face),
``sampler`` (the generator's sampler for the type). Callers write ``primeintellect.sampler.from_engine``; the modules
import each other, never this face."""
from kubeforge.runtime.agents.primeintellect import adapter, sampler

__all__ = ["adapter", "sampler"]
