"""Multi-turn episodes: environments (``protocol``, ``envs/``), where their steps run (``host``), the record of one
episode (``episode``) and the runner that alternates vLLM policy turns with environment turns (``runner``).
See docs/agents.md."""
