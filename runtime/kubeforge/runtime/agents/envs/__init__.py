"""The built-in environments, one module each (``calculator``, ``guess_number``, ``code_feedback``), what they share
(``tags``: the tool-call tag protocol; ``arith``: the calculator's safe evaluator), an OpenEnv server as an
environment (``openenv_http``); ``registry`` maps ``spec.environment.type`` to a factory."""
