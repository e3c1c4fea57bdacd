"""The reward curve of a run as a PNG (matplotlib, headless Agg backend)."""
from __future__ import annotations

import pathlib
from collections.abc import Sequence

from kubeforge.api import progress


def reward_curve(records: Sequence[progress.StepRecord], *, path: pathlib.Path, title: str) -> pathlib.Path:
    """Plot mean reward per step (and a 10-step moving average), and the held-out greedy accuracy at each
    evaluation when the job has one (same axis: both lie in [0, 1] for the usual verifiers), and for a job with
    ``spec.environment`` the mean policy turns per episode beside them (right axis); returns ``path``."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    steps = [r.step for r in records if r.mean_reward is not None]
    rewards = [r.mean_reward for r in records if r.mean_reward is not None]
    avg = [sum(rewards[max(0, i - 9):i + 1]) / len(rewards[max(0, i - 9):i + 1]) for i in range(len(rewards))]
    fig, ax = plt.subplots(figsize=(7, 4), dpi=100)
    ax.plot(steps, rewards, alpha=0.4, label="mean reward")
    ax.plot(steps, avg, label="10-step average")
    ax.set_xlabel("optimizer step")
    ax.set_ylabel("reward")
    ax.set_title(title)
    ax.grid(alpha=0.3)
    evals = [(0, r.eval_accuracy_base) for r in records if r.eval_accuracy_base is not None]
    evals += [(r.step, r.eval_accuracy) for r in records if r.evaluated and r.eval_accuracy is not None]
    if evals:
        ax.plot([s for s, _ in evals], [a for _, a in evals], "o-", color="tab:green",
                label="held-out greedy accuracy")
    turns = [(r.step, r.episode_turns_mean) for r in records if r.episode_turns_mean is not None]
    handles, labels = ax.get_legend_handles_labels()
    if turns:
        right = ax.twinx()
        right.plot([s for s, _ in turns], [t for _, t in turns], color="tab:purple", alpha=0.7,
                   label="turns per episode")
        right.set_ylabel("turns per episode")
        more = right.get_legend_handles_labels()
        handles, labels = handles + more[0], labels + more[1]
    ax.legend(handles, labels, loc="upper left")
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
    return path
