"""The scheduler node: hands out data to workers and re-assigns the part of a worker that dies.

Tasks ``0 .. n-1`` are blocks of the training data. A worker asks ``("next",)`` and gets a task id
or ``None`` (nothing left); it reports ``("finished", task)``. When a worker's Pipe closes
(``PeerLost``), its unfinished tasks go back to the front of the queue for the survivors
(Li et al., OSDI 2014, section 4.4: "the scheduler ... reassigns the task to another worker").
A worker that asks while the queue is empty but tasks are still running elsewhere is parked
until one of them finishes or comes back.
"""
from __future__ import annotations

from collections import deque

from course_lib.runtime.comm import PeerLost

NEXT, FINISHED = "next", "finished"


def schedule(comm, workers, n_tasks: int) -> dict:
    todo = deque(range(n_tasks))
    owner: dict = {}                     # task -> worker rank it is assigned to
    done_by: dict = {}                   # task -> worker rank that finished it
    alive, released, parked = set(workers), set(), []
    reassigned = []

    def give(w):
        if todo:
            t = todo.popleft()
            owner[t] = w
            comm.send(t, w)
        elif len(done_by) == n_tasks:
            comm.send(None, w)
            released.add(w)
        else:
            parked.append(w)             # a running task may still come back

    while alive - released:
        try:
            src, msg = comm.recv_any()
        except PeerLost as exc:
            w = exc.rank
            if w not in alive:
                if w < 0:
                    break
                continue
            alive.discard(w)
            back = [t for t, o in owner.items() if o == w and t not in done_by]
            for t in back:
                del owner[t]
                todo.appendleft(t)
                reassigned.append((t, w))
            if w in parked:
                parked.remove(w)
        else:
            if src not in alive:
                continue
            if msg[0] == FINISHED:
                done_by[msg[1]] = src
            elif msg[0] == NEXT:
                give(src)
        for w in list(parked):           # wake the parked: new work or the end
            if todo or len(done_by) == n_tasks:
                parked.remove(w)
                give(w)
    return {"done_by": done_by, "reassigned": reassigned, "lost": sorted(set(workers) - alive)}


def next_task(comm, scheduler: int):
    comm.send((NEXT,), scheduler)
    return comm.recv(source=scheduler)


def report(comm, scheduler: int, task: int) -> None:
    comm.send((FINISHED, task), scheduler)


__all__ = ["schedule", "next_task", "report"]
