"""A generator scaled down while it sits inside a weight receive: its leave notice still reaches trainer 0 at once.

The real-pod failure this guards: a generator pod deleted mid-receive never ran its SIGTERM handler (Python handlers
wait for the main thread, blocked in gloo), so it was SIGKILLed after its grace period without a leave notice and
trainer 0 kept it as a member. Here a real generator process (``generator.loop.run`` with the signal watcher of
``startup``) joins a real gloo weight-sync group (world 3: this test's sender, a slow receiver thread here, the
generator), blocks in the receive, gets SIGTERM, and must send its leave notice while still blocked; once the
broadcast completes it acks the sync and exits 0, without a second notice. With the pod's wiring
(``generator.start.leave_then_exit``) it does not wait for the broadcast: it exits 0 a few seconds after the notice,
well inside the kubelet's grace period, and the trainer's push fails at once instead of at its timeout.
"""
from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import textwrap
import threading
import time

import pytest
import torch

from kubeforge.runtime import transport, weightsync, wire

GENERATOR = textwrap.dedent("""
    import sys, threading
    from kubeforge.runtime import transport, weightsync as ws
    from kubeforge.runtime import startup as role_main
    from kubeforge.runtime.generator import loop, start as start_generator

    inbox_address, control_address, exit_soon = sys.argv[1], sys.argv[2], sys.argv[3] == "exit"
    stop = role_main._stop_flag()
    leave = loop.LeaveNotice(index=1, open_control=lambda t: transport.open_sender(
        [control_address], role="generator", index=1, ready_timeout=t, send_timeout=t))
    done = threading.Event()
    role_main.watch_signals(lambda: start_generator.leave_then_exit(leave, done, grace=3.0) if exit_soon
                            else leave.send())

    class Weights:
        def load(self, sync):
            r = ws.WeightReceiver(host=sync.host, port=sync.port, world_size=sync.world_size, rank=2, timeout=120,
                                  epoch=sync.epoch)
            stats = r.receive(lambda it: [x for x in it])
            r.close()
            return loop.SyncResult(seconds=stats.seconds, bytes=stats.bytes)

    class NoVerifiers:
        peers = 0

    class Quiet:
        def __getattr__(self, name):
            return lambda **kw: None

    inbox = transport.open_receiver(inbox_address)
    control = transport.open_sender([control_address], role="generator", index=1)
    loop.run(index=1, inbox=inbox, verifiers=NoVerifiers(), control=control, sampler=None, weights=Weights(),
             observer=Quiet(), should_stop=stop.is_set, leave=leave)
    print("generator: loop ended", flush=True)
""")


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.mark.parametrize("wiring", ["notice-only", "exit"])
def test_sigterm_inside_a_weight_receive_sends_the_leave_notice_at_once(wiring: str) -> None:
    store_port, inbox_port = _port(), _port()
    control = transport.open_receiver("tcp://127.0.0.1:*")
    gen = subprocess.Popen([sys.executable, "-c", GENERATOR, f"tcp://127.0.0.1:{inbox_port}", control.address,
                            wiring], env={**os.environ})
    slow_may_receive, errors = threading.Event(), []
    sent = threading.Event()
    try:
        got: list[wire.Message] = []

        def until(pred: object, seconds: float) -> wire.Message | None:
            end = time.monotonic() + seconds
            while time.monotonic() < end:
                msg = control.recv(timeout=0.2)
                if msg is not None:
                    got.append(msg)
                    if pred(msg):  # type: ignore[operator]
                        return msg
            return None

        assert until(lambda m: isinstance(m, wire.Ready), 120) is not None, "the generator never said READY"

        def slow_receiver() -> None:      # generator 0, still sampling: joins, receives only when told
            try:
                r = weightsync.WeightReceiver(host="127.0.0.1", port=store_port, world_size=3, rank=1, timeout=120)
                slow_may_receive.wait(120)
                r.receive(lambda it: [x for x in it])
                r.close()
            except BaseException as e:  # surfaced below
                errors.append(e)

        sender = weightsync.WeightSender(host="127.0.0.1", port=store_port, world_size=3,
                                         timeout=15 if wiring == "exit" else 120, join_timeout=120, bucket_mb=1)

        def push() -> None:
            try:
                sender.send([(f"w{i}", torch.randn(256, 1024)) for i in range(4)], version=7)
                sent.set()
            except BaseException as e:  # surfaced below
                errors.append(e)

        threading.Thread(target=slow_receiver, daemon=True).start()
        to_gen = transport.open_sender([f"tcp://127.0.0.1:{inbox_port}"], role="trainer", index=0)
        to_gen.send(wire.Sync(version=7, step=7, host="127.0.0.1", port=store_port, world_size=3, epoch=0))
        pusher = threading.Thread(target=push, daemon=True)
        pusher.start()
        time.sleep(3.0)                   # the generator has joined and waits in the receive (the sender waits)
        assert not sent.is_set() and gen.poll() is None

        gen.send_signal(signal.SIGTERM)
        started = time.monotonic()
        left = until(lambda m: isinstance(m, wire.Ack) and m.of == wire.Kind.STOP, 20)
        assert left is not None, "no leave notice while the generator was blocked in the receive"
        assert time.monotonic() - started < 20 and left.index == 1
        assert not sent.is_set()                              # it was sent from inside the receive
        if wiring == "exit":            # the pod's wiring: gone 3 s after the notice, the sync still pending
            assert gen.wait(30) == 0 and not sent.is_set()
            slow_may_receive.set()
            pusher.join(150)
            assert not sent.is_set() and errors and isinstance(errors[0], weightsync.WeightSyncError)
            sender.close()
            to_gen.close()
            return
        assert gen.poll() is None

        slow_may_receive.set()            # the broadcast completes; the generator acks, sees the stop, exits 0
        acked = until(lambda m: isinstance(m, wire.Ack) and m.of == wire.Kind.SYNC, 60)
        pusher.join(60)
        assert sent.is_set() and not errors, errors
        assert acked is not None and acked.ok and acked.version == 7
        assert gen.wait(60) == 0
        until(lambda m: False, 1.0)
        assert sum(1 for m in got if isinstance(m, wire.Ack) and m.of == wire.Kind.STOP) == 1   # once
        sender.close()
        to_gen.close()
    finally:
        if gen.poll() is None:
            gen.kill()
            gen.wait()
        control.close()
