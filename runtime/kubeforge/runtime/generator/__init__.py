"""The generator role: work in, ``groupSize`` completions per prompt out to the verifiers, new weights between batches.

Modules: ``loop`` (the role's loop; sampler, weight loader and transport injected), ``start`` (``kubeforge role
generator``: sockets, then the vLLM engine, wired around the loop), ``engine`` (``Engine`` wraps one ``vllm.LLM``),
``extension`` (``WeightSyncExtension`` runs inside its worker(s) and receives weights from the trainer through
``kubeforge.runtime.weightsync``), ``swap_reload`` (the next weights' kernels built beside the serving
model, swapped in between batches), ``fence`` (``PushFence``: a SYNC of a stale trainer epoch refused).

Import ``kubeforge.runtime.generator.engine`` only where vLLM is installed (the generator role, tests marked
``vllm``); this package's ``__init__`` imports nothing heavy.
"""
