"""The generator's engine: ``engine.Engine`` wraps one ``vllm.LLM``; ``extension.WeightSyncExtension`` runs inside
its worker(s) and receives weights from the trainer (``kubeforge.runtime.weightsync``).

Import ``kubeforge.runtime.generator.engine`` only where vLLM is installed (the generator role, tests marked
``vllm``); this package's ``__init__`` imports nothing heavy.
"""
