"""The verifier role's observer: per-verifier Prometheus series (scores, errors, fallbacks, accuracies, weights,
cache) and one JSON line per scored group in the run's metrics (``verifier-<index>.jsonl``)."""
from __future__ import annotations

import json
import math
import pathlib

import numpy as np

from kubeforge.api import rljob
from kubeforge.runtime import metrics, types, verifiers
from kubeforge.runtime import observe


def test_observer_exports_per_verifier_series_and_logs_each_group(tmp_path: pathlib.Path) -> None:
    specs = [rljob.VerifierSpec.model_validate({"name": n, "type": "Regex", "regex": {"pattern": p},
                                                 "timeoutSeconds": 0.2})
             for n, p in (("one", "1"), ("onetwo", "1|2"), ("onethree", "1|3"), ("evil", "(x+x+)+y"))]
    reward = rljob.RewardSpec.model_validate({"aggregation": "WeakSupervision",
                                              "weakSupervision": {"minItems": 16, "maxPositiveRate": 1.0}})
    scorer = verifiers.Scorer(specs, reward=reward)
    m = metrics.Metrics(role="verifier", replica=0)
    log = tmp_path / "verifier-0.jsonl"
    obs = observe.VerifierObserver(m, scorer.errors, scorer=scorer, log_path=log)
    rng = np.random.default_rng(0)
    for step in range(3):
        texts = ["".join(rng.choice(list("0123"), 3)) for _ in range(7)] + ["x" * 3000]
        g = types.RolloutGroup(prompt=types.Prompt(index=step, text="q", answer=""), prompt_token_ids=[1],
                               completions=[types.Completion(token_ids=[], logprobs=[], text=t) for t in texts],
                               policy_version=step, step=step)
        obs.scored(group=scorer.apply(g), seconds=0.01)
    obs.scored(group=scorer.apply(g), seconds=0.01)   # the same group again: all cache hits
    obs.close()
    text = m.render().decode()
    # a fallback is never cached: the repeated group's time-out comes back, and is counted again
    assert 'kubeforge_verifier_fallbacks_total{replica="0",role="verifier",verifier="evil"} 4.0' in text
    assert scorer.cache_hits >= 4 * 7 - 1
    assert f'kubeforge_verifier_cache_total{{replica="0",result="hit",role="verifier"}} {scorer.cache_hits}.0' in text
    acc = [ln for ln in text.splitlines() if ln.startswith("kubeforge_verifier_accuracy{") and '"one"' in ln]
    assert acc and 0.5 <= float(acc[0].split()[-1]) <= 1.0
    assert "kubeforge_verifier_weight{" in text
    recs = [json.loads(ln) for ln in log.read_text().splitlines()]
    assert [r["step"] for r in recs] == [0, 1, 2, 2] and len(recs[0]["rewards"]) == 8
    assert recs[-1]["rewards"] == recs[-2]["rewards"]
    assert recs[0]["fallbacks"] == {"evil": 1} and set(recs[0]["mean_scores"]) == {"one", "onetwo", "onethree", "evil"}
    assert recs[-1]["accuracy"]["one"] is not None and not math.isnan(recs[-1]["weight"]["one"])
