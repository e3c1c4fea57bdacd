"""Multi-turn episodes, folded by kind (docs/agents.md, "Where each part lives")::

    protocol, episode        the environment protocol users implement; the record of one episode
    runner, chat, native     the built-in episode runner: vLLM policy turns alternating with environment turns
                             (``native``: the model's own tool calls, spec.environment.toolFormat Native)
    envs/                    the built-in environments and the registry of ``spec.environment.type``
    hosts/                   where environment steps run: in process, worker processes, a verifier's env server
    endpoint/                the OpenAI-compatible endpoint that records every model call into its episode
    primeintellect/          ``type: Verifiers``: PrimeIntellect's ``verifiers`` library run against the endpoint
    toolcalls/               each model family's tool-call format: rendered by its chat template, parsed back

Arrows run down this list's kinds, never up: ``envs`` and ``hosts`` know nothing of the runner, ``endpoint`` nothing
of the library; nothing here imports a role package (generator, verifier, trainer).
"""
