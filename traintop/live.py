"""Assembles one Frame per tick from the live collectors."""

from __future__ import annotations

import time

from traintop.samples import Frame


class LiveSampler:
    def __init__(self, gpu=None, host=None, process=None, probes=None, clock=time.time) -> None:
        self.gpu = gpu
        self.host = host
        self.process = process
        self.probes = probes
        self._clock = clock

    def next_frame(self) -> Frame:
        t = self._clock()
        gpus = self.gpu.sample() if self.gpu is not None else ()
        host = self.host.sample() if self.host is not None else None
        proc = self.process.sample() if self.process is not None else None
        ranks = ()
        if self.probes is not None and proc is not None and proc.alive:
            ranks = self.probes.sample(self.process.channel_pids())
        return Frame(t=t, gpus=gpus, host=host, process=proc, ranks=ranks)

    def close(self) -> None:
        if self.gpu is not None:
            self.gpu.close()
        if self.probes is not None:
            self.probes.close()
