"""The lesson manifest: the one list of the course's lessons.

Each :class:`Lesson` names its notebook, exercise and solution (by number and slug), the
questions its exercise asks, the library package it teaches, the test files that check
it, its time, and the summary the README's lesson table shows. The README table
(``python -m course_lib.lessons --readme``), the exercise generator, the release build,
the grader's table of exercise notebooks and the tests all read this list; a test fails if a
lesson file exists that it does not list, or the other way round. Adding a lesson is one
entry here plus its files.
"""
from __future__ import annotations

import argparse
import pathlib
import re
from dataclasses import dataclass


@dataclass(frozen=True)
class Lesson:
    number: str                  # "04": orders the lessons and prefixes every file name
    slug: str                    # "gossip": the rest of the file name
    title: str
    time: str                    # "teaching / exercises", as the README shows it
    package: str | None          # the course_lib package this lesson teaches (None: tools only)
    questions: tuple[str, ...]   # exercise question ids, "ex04_1", ...; empty: no exercise
    tests: tuple[str, ...]       # files in tests/ that check this lesson's library and notebook
    summary: str                 # what you do, one paragraph (the README table's middle column)
    # exercise answers the lesson's own cells run (any lesson's): in the student release these run
    # the student's code, and the lesson's status cell lists them (course_lib.replay.lesson_status)
    uses: tuple[str, ...] = ()

    @property
    def notebook(self) -> str:
        """File name of the lesson notebook (notebooks/), and of its exercise and solution."""
        return f"{self.number}_{self.slug}.ipynb"

    @property
    def graded(self) -> bool:
        return bool(self.questions)


LESSONS = (
    Lesson("00", "cluster_in_your_laptop", 'The cluster in your laptop',
           time='35 / 25 min', package='runtime',
           questions=('ex00_1', 'ex00_2', 'ex00_3'),
           uses=('ex00_2',),
           tests=('test_runtime.py', 'test_faults.py', 'test_p2p_mpi4py.py',
                  'test_netem.py', 'test_hardware.py'),
           summary=(
               'probe your cores, start workers, shared arrays, send/recv, measure and fit latency + '
               'bytes/bandwidth, emulated network, timelines')),
    Lesson("01", "mapreduce_gd", 'MapReduce gradient descent, speedup and stragglers',
           time='45 / 40 min', package='mapreduce',
           questions=('ex01_1', 'ex01_2', 'ex01_3', 'ex01_4', 'ex01_5'),
           uses=('ex00_2', 'ex01_2', 'ex01_3', 'ex01_4'),
           tests=('test_mapreduce.py',),
           summary=(
               'the gradient as a sum over samples; server/worker MapReduce GD on shared-memory shards equals '
               'single-process GD; words per iteration against the formula (sum / mean / collect); speedup '
               'against the ideal and T(p) = T_compute/p + comm + sync under a ceiling from the effective cores and '
               'emulated latency; incast at the server on an emulated network (collect flat in p, sum unharmed); '
               "a straggler in the timeline; a killed worker's map re-executed in its new rank's row; a killed "
               'server resumed from a checkpoint; minibatch SGD on the same workers (same words per iteration, '
               'gradient noise (N - B)/(N - 1) sigma^2/B measured, a noise floor above the optimum)')),
    Lesson("02", "collectives", 'Collective communication, costed',
           time='60 / 60 min', package='collectives',
           questions=('ex02_1', 'ex02_2', 'ex02_3', 'ex02_4', 'ex02_5'),
           uses=('ex02_3', 'ex02_4'),
           tests=('test_collectives.py', 'test_syncbn.py', 'test_sharp.py'),
           summary=(
               "the MPI vocabulary with mpi4py's methods; step through who sends what to whom (barrier, bcast, "
               'scatter/gather, allgather ring / recursive doubling / Bruck, reduce-scatter, allreduce tree / '
               'ring / Rabenseifner) in a widget; bytes and messages equal the formulas exactly; alpha, beta, '
               'gamma measured and the Thakur et al. (2005) model drawn over timings; the tree/ring crossover; '
               'float16 on the wire halves the bytes; shared-memory allreduce; misuse caught with a named error; '
               "groups (Split) and the source notes' ScatterGather; SyncBatchNorm by merging (count, mean, M2), "
               'and why E[x^2]-E[x]^2 fails in float32; in-network aggregation (SHARP): a switch process adds, n bytes '
               'each way per host link in 2 latency steps, against ring and trees')),
    Lesson("03", "async_parameter_server", 'The asynchronous parameter server, staleness, and Hogwild!',
           time='45 / 40 min', package='async_ps',
           questions=('ex03_1', 'ex03_2', 'ex03_3', 'ex03_4', 'ex03_5'),
           uses=('ex03_1', 'ex03_2', 'ex03_3', 'ex03_4', 'ex03_5'),
           tests=('test_async_ps.py',),
           summary=(
               "an asynchronous parameter server on real processes: the staleness of every gradient against wall "
               "time, the source notes' two fast workers and a slow one (histogram, gradients many versions late, "
               'loss jumps), sync vs '
               'async against updates and wall time, remedies side by side (staleness-aware step, dropping, '
               'backup workers with the wait mu (H_{N+b} - H_b)), a worker killed mid-run; Hogwild! lock-free vs '
               'locked vs serial vs two processes that share nothing (timed in turns), with Omega / Delta / rho '
               'and counted collisions; FedAvg (E local steps) against '
               'synchronous SGD in rounds and bytes, non-IID drift, a slow client waited for or left out')),
    Lesson("04", "gossip", 'Decentralized learning, gossip and D-PSGD',
           time='60 / 40 min', package='gossip',
           questions=('ex04_1', 'ex04_2', 'ex04_3', 'ex04_4'),
           uses=('ex04_1', 'ex04_2', 'ex04_3', 'ex04_4'),
           tests=('test_gossip.py', 'test_lesson04.py'),
           summary=(
               'peer-to-peer learning on networkx graphs: Metropolis-Hastings weights and their spectrum '
               '(lambda_2, lambda_n, r = max(lambda_2, abs(lambda_n))), gossip on real node processes with Pipes '
               'only along edges (error under r^t, equal to the matrix iteration), spectral gap against n (ring, '
               'torus, hypercube, expander), a disconnected graph that never agrees, randomized pairwise gossip, '
               "D-PSGD against a sync and an async server with bytes at the busiest node, on an emulated slow "
               "network D-PSGD's iteration against the server's with the alpha-beta model beside each, the "
               'closing table of source note 003 measured')),
    Lesson("05", "parameter_server_internals", 'Inside the parameter server',
           time='45 / 40 min', package='ps',
           questions=('ex05_1', 'ex05_2', 'ex05_3', 'ex05_4', 'ex05_5', 'ex05_6'),
           uses=('ex02_4', 'ex05_1', 'ex05_2', 'ex05_3', 'ex05_4', 'ex05_5'),
           tests=('test_ps.py', 'test_lesson05.py'),
           summary=(
               'inside the parameter server (Li et al., OSDI 2014): key ranges on a consistent-hashing ring, '
               'sorted-key push/pull over several server processes, sparse logistic regression pulling only '
               'touched keys, sequential / bounded-delay / eventual consistency with the SSP invariant checked, '
               'significantly-modified and KKT filters, key caching and compression, vector clocks per range, a '
               'server killed mid-training and its replica taking over, a server joining with replicas in two '
               'phases (streamed pre-copy, then the changes made meanwhile) while training goes on, a dead '
               "worker's data reassigned; a pull that depends on the last push against one that overlaps the "
               'gradient (staleness 0 vs 1, time per iteration, the final models against synchronous and delayed '
               'SGD); the same model trained on the servers and with a ring allreduce from 0.1 % to 100 % '
               'density: bytes at the busiest rank (exact, message by message) and emulated time per step, the '
               'crossover predicted and measured')),
    Lesson("06", "model_and_pipeline_parallel", 'Beyond data parallelism: model (tensor) and pipeline parallelism',
           time='45 / 40 min', package='model_parallel',
           questions=('ex06_1', 'ex06_2', 'ex06_3', 'ex06_4', 'ex06_5', 'ex06_6'),
           uses=('ex06_1', 'ex06_2', 'ex06_3', 'ex06_4', 'ex06_5', 'ex06_6'),
           tests=('test_model_parallel.py',),
           summary=(
               'split a two-layer network by columns and rows over real processes (equal to serial; allgather / '
               'reduce-scatter / allreduce bytes; memory per worker 1/p), factorise a matrix too large for one '
               'worker with blocks owned by workers, GPipe and 1F1B pipelines with micro-batches: the bubble '
               '(p-1)/(m+p-1) exact in steps and measured in timelines; data vs tensor vs pipeline from measured '
               "runs; TensorFlow's in-graph vs between-graph replication, run as graphs placed on workers")),
    Lesson("07", "beyond_one_machine", 'Beyond one machine: the same code on MPI',
           time='45 / 30 min', package='beyond_one_machine',
           questions=('ex07_1', 'ex07_2', 'ex07_3', 'ex07_4'),
           uses=('ex02_4', 'ex07_4'),
           tests=('test_mpi.py', 'test_lesson07.py', 'test_shm_sync.py', 'test_scheduling.py'),
           summary=(
               'run the same programs on MPI (`mpiexec`) with identical numbers and bytes, allreduce bandwidth '
               'side by side (shared memory, ring over Pipes, `MPI_Allreduce`, memcpy), how a multi-host run is '
               'launched and how it maps to `torch.distributed` / NCCL; real links from one hardware table '
               'priced with the cost model; two jobs sharing the cores, gang-scheduled (SIGSTOP/SIGCONT time '
               'slices) against uncoordinated, and a job whose workers start late, measured')),
    Lesson("08", "data_parallelism_in_practice",
           'Data parallelism as it is practised: memory, overlapped buckets, mixed precision, ZeRO',
           time='50 / 35 min', package='data_parallel',
           questions=('ex08_1', 'ex08_2', 'ex08_3', 'ex08_4', 'ex08_5'),
           uses=('ex02_4', 'ex08_1', 'ex08_2', 'ex08_4', 'ex08_5'),
           tests=('test_dp_model.py', 'test_dp_memory.py', 'test_mixed_precision.py', 'test_iallreduce.py',
                  'test_ddp.py', 'test_zero.py', 'test_compression.py', 'test_lesson08.py'),
           summary=(
               'bytes per parameter of mixed-precision Adam (2 + 2 + 12) and activations against batch size, '
               "measured from a worker's arrays; DDP's buckets in reverse layer order allreduced with "
               '`iallreduce` while backward goes on (timeline, step time against bucket size beside the '
               'alpha-beta model, equal to serial training); fp16 with fp32 master weights and dynamic loss '
               'scaling against a run that underflows; ZeRO stages 1-3 by reduce-scatter and allgather (memory '
               'per worker and bytes per step measured against the formulas, the same model as plain data '
               'parallel); top-k gradient compression with and without error feedback')),
)

BY_NUMBER = {lesson.number: lesson for lesson in LESSONS}
TABLE_START = "| # | notebook | what you do | teaching / exercises |"
TABLE_END = "<!-- lesson-table-end -->"


def graded() -> list[Lesson]:
    """The lessons with an exercise notebook (and a solution, hidden checks and a reference)."""
    return [lesson for lesson in LESSONS if lesson.graded]


def lesson(number: str) -> Lesson:
    if number not in BY_NUMBER:
        raise KeyError(f"no lesson {number!r}; lessons: {sorted(BY_NUMBER)}")
    return BY_NUMBER[number]


def readme_table() -> str:
    """The README's lesson table, from this manifest."""
    lines = [TABLE_START, "|---|---|---|---|"]
    for x in LESSONS:
        lines.append(f"| {x.number} | [`{x.notebook}`](notebooks/{x.notebook}) | {x.summary} | {x.time} |")
    return "\n".join(lines) + "\n" + TABLE_END


def with_readme_table(readme: str) -> str:
    """``readme`` with its lesson table replaced by :func:`readme_table`."""
    pattern = re.escape(TABLE_START) + r".*?" + re.escape(TABLE_END)
    if not re.search(pattern, readme, flags=re.S):
        raise ValueError("the README has no lesson table (a line starting with the header "
                         f"{TABLE_START!r}, ending with {TABLE_END!r})")
    return re.sub(pattern, lambda _: readme_table(), readme, count=1, flags=re.S)


def start_page():
    """``START_HERE.ipynb``, the page ``make lab`` opens: each lesson with its exercise, from this
    manifest (``python -m course_lib.lessons --start-page``; a test keeps the file in sync)."""
    import nbformat

    rows = "\n".join(
        f"| {x.number} | [{x.title}](notebooks/{x.notebook}) | "
        + (f"[exercises/{x.notebook}](exercises/{x.notebook}) ({len(x.questions)} questions)" if x.graded else "none")
        + f" | {x.time} |" for x in LESSONS)
    text = f"""# Distributed machine learning, taught with real processes

Every distributed algorithm here runs on real worker processes on this machine. Take the lessons in
order: open a lesson, run it top to bottom (Run > Run All Cells), play with its widgets, then solve its
exercise notebook.

| # | lesson | exercise | teaching / exercises |
|---|---|---|---|
{rows}

**Checking an answer.** In an exercise notebook, each question ends with a check cell such as
`check("ex00_1")`: it runs the question's visible checks on your code in real worker processes and
prints a pass, or a fail with a hint. The grader also runs hidden checks on other inputs, so write
general code. To grade a whole exercise notebook the way your instructor will (visible checks only
here), run `make grade NB=exercises/00_{LESSONS[0].slug}.ipynb` in a terminal.

**Lessons that run on your answers.** In the student release, some lesson cells run *your* answer
to an exercise; each lesson's first cells list which ones. Until you have written it, such a cell
shows the result recorded when the course was built and says so in a first line; save the
exercise notebook after solving, and run the cell again.
"""
    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_markdown_cell(text)]
    nb.cells[0].id = "start-page"
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    return nb


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--readme", metavar="PATH", help="rewrite the lesson table of this README")
    parser.add_argument("--start-page", metavar="PATH", help="write the start page (START_HERE.ipynb) here")
    args = parser.parse_args(argv)
    if args.start_page:
        import nbformat

        nbformat.write(start_page(), args.start_page)
    if args.readme:
        path = pathlib.Path(args.readme)
        path.write_text(with_readme_table(path.read_text()))
    if not (args.readme or args.start_page):
        for x in LESSONS:
            print(f"{x.number}  {x.title}  ({x.time}; questions: {', '.join(x.questions) or 'none'})")


if __name__ == "__main__":
    main()
