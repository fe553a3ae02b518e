"""The scheduler node: hands out data to workers and re-assigns the part of a worker that dies.

Tasks ``0 .. n-1`` are blocks of the training data. A worker asks for one (:class:`.messages.NextTask`)
and gets a task id or ``None`` (nothing left); it reports :class:`.messages.TaskFinished`. When a
worker's Pipe closes (``PeerLost``), its unfinished tasks go back to the front of the queue for
the survivors (Li et al., OSDI 2014, section 4.6, worker management: the task scheduler gives the
data of a worker that left to another one). A worker that asks while the queue is empty but tasks
are still running elsewhere is parked until one of them finishes or comes back.
"""
from __future__ import annotations

from collections import deque
from typing import Callable, ClassVar

from course_lib.runtime.comm import PeerLost

from .messages import Message, NextTask, TaskFinished, decode, encode, handler_for


class Scheduler:
    """The scheduler rank's state: the task queue, who holds what, who waits."""

    def __init__(self, comm, workers, n_tasks: int):
        self.comm, self.workers, self.n_tasks = comm, list(workers), n_tasks
        self.todo = deque(range(n_tasks))
        self.owner: dict[int, int] = {}        # task -> worker rank it is assigned to
        self.done_by: dict[int, int] = {}      # task -> worker rank that finished it
        self.alive, self.released = set(self.workers), set()
        self.parked: list[int] = []            # workers waiting for a task that may come back
        self.reassigned: list[tuple[int, int]] = []   # (task, the dead worker it came back from)

    def run(self) -> dict:
        while self.alive - self.released:
            try:
                src, wire = self.comm.recv_any()
            except PeerLost as exc:
                if exc.rank in self.alive:
                    self._worker_lost(exc.rank)
                elif exc.rank < 0:             # no live neighbour left
                    break
                else:                          # a link we do not serve (a server) or already closed
                    continue
            else:
                if src not in self.alive:
                    continue
                msg = decode(wire)
                handler_for(self.HANDLERS, msg, "the scheduler")(self, src, msg)
            self._wake_parked()
        return {"done_by": self.done_by, "reassigned": self.reassigned,
                "lost": sorted(set(self.workers) - self.alive)}

    @property
    def all_done(self) -> bool:
        return len(self.done_by) == self.n_tasks

    def on_next_task(self, worker: int, msg: NextTask) -> None:
        self._give(worker)

    def on_task_finished(self, worker: int, msg: TaskFinished) -> None:
        self.done_by[msg.task] = worker

    HANDLERS: ClassVar[dict[type[Message], Callable[[Scheduler, int, Message], None]]] = {
        NextTask: on_next_task, TaskFinished: on_task_finished}

    def _give(self, worker: int) -> None:
        if self.todo:
            task = self.todo.popleft()
            self.owner[task] = worker
            self.comm.send(task, worker)
        elif self.all_done:
            self.comm.send(None, worker)
            self.released.add(worker)
        else:
            self.parked.append(worker)         # a running task may still come back

    def _worker_lost(self, worker: int) -> None:
        """Its unfinished tasks go to the front of the queue."""
        self.alive.discard(worker)
        back = [t for t, o in self.owner.items() if o == worker and t not in self.done_by]
        for task in back:
            del self.owner[task]
            self.todo.appendleft(task)
            self.reassigned.append((task, worker))
        if worker in self.parked:
            self.parked.remove(worker)

    def _wake_parked(self) -> None:
        """New work or the end: answer the parked workers."""
        for worker in list(self.parked):
            if self.todo or self.all_done:
                self.parked.remove(worker)
                self._give(worker)


def schedule(comm, workers, n_tasks: int) -> dict:
    """The scheduler rank's loop: until every worker has been told there is nothing left (or died)."""
    return Scheduler(comm, workers, n_tasks).run()


def next_task(comm, scheduler: int):
    """Worker side: the next task id for me, or None."""
    comm.send(encode(NextTask()), scheduler)
    return comm.recv(source=scheduler)


def report(comm, scheduler: int, task: int) -> None:
    """Worker side: I finished ``task``."""
    comm.send(encode(TaskFinished(task)), scheduler)


__all__ = ["Scheduler", "schedule", "next_task", "report"]
