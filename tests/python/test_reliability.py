"""Hostile input to the Python module `pebble`: objects made without a
constructor, policies that never return or interrupt, arguments of the wrong
type or out of range, control characters in names, budgets of huge graphs and
odd schedules, graph texts and paths. Each case ends in a clean Python
exception that names the culprit (or in the right answer), never in a crash
or a hang; code that used to crash the interpreter runs in a child process,
so that a crash fails the test instead of killing the suite.

Run by ctest (python_reliability) with PYTHONPATH at the build's python/ and
PEBBLE_CLI the `pebble` binary; by hand:

    PYTHONPATH=build/python PEBBLE_CLI=build/bin/pebble \
        python3 -m unittest -v tests/python/test_reliability.py
"""

import copy
import fractions
import json
import math
import os
import re
import pickle
import subprocess
import sys
import tempfile
import textwrap
import time
import unittest

import pebble

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
CLI = os.environ.get("PEBBLE_CLI", os.path.join(ROOT, "build", "bin", "pebble"))
MODEL = "resnet18:batch=2,image=32"
INT64_MAX = 2**63 - 1


def run_python(code, timeout=60):
    """Runs `code` in a new interpreter: (exit status, stdout, stderr). A
    crash is a negative status here, not the end of this process."""
    try:
        out = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True,
                             text=True, timeout=timeout)
    except subprocess.TimeoutExpired as e:
        raise AssertionError(f"the child did not finish within {timeout} s "
                             f"(stdout: {e.stdout!r})") from None
    return out.returncode, out.stdout, out.stderr


def cli_error(*args):
    """The message of a failing command line, as the module words it: a
    malformed flag (exit 2) is framed by the flag's name and a pointer to
    --help, which the module's ValueError has no use for."""
    out = subprocess.run([CLI, *args], capture_output=True, text=True)
    assert out.returncode in (1, 2), (out.returncode, out.stderr)
    line = out.stderr.strip()
    assert line.startswith("pebble: "), line
    line = line[len("pebble: "):]
    if out.returncode == 2:
        line = re.sub(r"^--[a-z-]+: ", "", line)
        line = re.sub(r" \(see 'pebble [a-z]+ --help'\)$", "", line)
    return line


def one_node_graph(size):
    """A graph of one generic node of `size` bytes: its baseline peak."""
    return pebble.from_json(json.dumps({
        "format": "pebble-graph", "version": 1, "name": "one",
        "nodes": [{"id": "x", "op": "generic", "bytes": size, "cost": 1}], "outputs": ["x"]}))


class UninitialisedObjectTest(unittest.TestCase):
    """pybind11 allocates an instance in __new__ and builds its C++ object in
    __init__; a class without a constructor used to hand out instances whose
    C++ object was never built."""

    def test_every_way_to_make_a_graph_or_plan_without_the_functions_is_refused(self):
        code = """
            import copy, pickle, pebble
            g = pebble.model("resnet18:batch=1,image=32")
            p = pebble.plan(g)
            for cls in (pebble.Graph, pebble.Plan):
                base = cls.__mro__[1]
                for how, make in [("__new__", lambda: cls.__new__(cls)),
                                  ("call", lambda: cls()),
                                  ("object.__new__", lambda: object.__new__(cls)),
                                  ("base.__new__", lambda: base.__new__(cls))]:
                    try:
                        obj = make()
                    except TypeError as e:
                        print(cls.__name__, how, "TypeError:", e)
                        continue
                    print(cls.__name__, how, "MADE", flush=True)
                    for use in (lambda o: o.ids, len, repr, lambda o: pebble.plan(o)):
                        try:
                            use(obj)
                        except Exception as e:
                            print("  use:", type(e).__name__, e, flush=True)
                try:
                    class Sub(cls):
                        pass
                    print(cls.__name__, "subclass MADE")
                except TypeError as e:
                    print(cls.__name__, "subclass TypeError:", e)
            try:
                copy.copy(p)
                print("Plan copy MADE")
            except TypeError as e:
                print("Plan copy TypeError:", e)
            try:
                pickle.loads(pickle.dumps(p))
                print("Plan pickle MADE")
            except (TypeError, pickle.PicklingError) as e:
                print("Plan pickle", type(e).__name__ + ":", e)
            print("done")
        """
        rc, out, err = run_python(code)
        self.assertEqual(rc, 0, f"the child died (status {rc}):\n{out}\n{err}")
        self.assertNotIn("MADE", out)
        self.assertIn("done", out)
        self.assertEqual(out.count("TypeError"), 12, out)
        self.assertIn("Graph __new__ TypeError: pebble.Graph cannot be created directly", out)
        self.assertIn("Plan __new__ TypeError: pebble.Plan cannot be created directly", out)

    def test_the_reported_crashes_are_type_errors(self):
        for code in ["pebble.Graph.__new__(pebble.Graph).ids",
                     "len(pebble.Graph.__new__(pebble.Graph))",
                     "pebble.plan(pebble.Graph.__new__(pebble.Graph))",
                     "repr(pebble.Plan.__new__(pebble.Plan))"]:
            with self.subTest(code=code):
                rc, out, err = run_python("import pebble\n" + code)
                self.assertEqual(rc, 1, f"status {rc}: {err}")
                self.assertIn("TypeError: pebble.", err.strip().splitlines()[-1])

    def test_a_graph_copies_and_pickles_through_its_json(self):
        g = pebble.model(MODEL)
        for other in (copy.copy(g), copy.deepcopy(g), pickle.loads(pickle.dumps(g))):
            self.assertIsInstance(other, pebble.Graph)
            self.assertEqual(other.to_json(), g.to_json())
            self.assertEqual(other.name, g.name)


class PythonPolicyTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.graph = pebble.model(MODEL)

    def tearDown(self):
        for p in pebble.policies():
            if p["external"]:
                pebble.unregister_policy(p["name"])

    def test_an_endless_policy_stops_at_the_time_limit(self):
        # In a child: before the fix the call never returned.
        code = """
            import time, pebble
            g = pebble.model("resnet18:batch=1,image=32")
            def endless(graph, options):
                while True:
                    pass
            def swallows(graph, options):  # catches everything once, the stop too
                try:
                    while True:
                        pass
                except BaseException:
                    pass
                while True:
                    pass
            pebble.register_policy("endless", endless)
            pebble.register_policy("swallows", swallows)
            for policy in ("endless", "swallows"):
                start = time.monotonic()
                try:
                    pebble.plan(g, policy=policy, time_limit=1)
                    print(policy, "PLANNED")
                except ValueError as e:
                    print(policy, round(time.monotonic() - start, 2), e)
            start = time.monotonic()
            rows = pebble.compare(g, policies=["endless"], budgets=["100%", "min"], time_limit=1,
                                  jobs=2)
            print("compare", round(time.monotonic() - start, 2), [r["error"] for r in rows])
            # Nothing stray is left pending in this thread.
            total = sum(range(3_000_000))
            print("after", total)
        """
        rc, out, err = run_python(code, timeout=30)
        self.assertEqual(rc, 0, f"status {rc}:\n{out}\n{err}")
        lines = out.splitlines()
        # At 1 s; the one that swallows the first stop at the next, 1 s later.
        for policy, limit, line in zip(("endless", "swallows"), (3.0, 4.0), lines):
            name, elapsed, message = line.split(" ", 2)
            self.assertEqual(name, policy)
            self.assertLess(float(elapsed), limit, line)
            self.assertIn(f"policy '{policy}'", message)
            self.assertIn("time limit of 1 s", message)
        self.assertTrue(lines[2].startswith("compare "), out)
        self.assertLess(float(lines[2].split()[1]), 4.5, out)  # two plans, maybe in turn
        self.assertEqual(lines[2].count("time limit of 1 s"), 2, out)
        self.assertEqual(lines[3], f"after {sum(range(3_000_000))}")

    def test_a_schedule_that_never_ends_is_read_within_the_time_limit(self):
        # A sequence whose __getitem__ never raises IndexError: reading it
        # never ended, at about 100 MB a second.
        class Endless:
            def __len__(self):
                return 10

            def __getitem__(self, i):
                return ("compute", "conv1")

        def refusal_within_5_s(name, schedule):
            """The message of a plan by a policy returning `schedule`, at a
            time limit of 1 s, refused within 5 s."""
            pebble.register_policy(name, lambda graph, options: schedule)
            start = time.monotonic()
            with self.assertRaises(ValueError) as e:
                pebble.plan(self.graph, policy=name, time_limit=1)
            self.assertLess(time.monotonic() - start, 5)
            self.assertIn("not read within the time limit", str(e.exception))
            return str(e.exception)
        self.assertIn("its Endless may never end",
                      refusal_within_5_s("endless-schedule", Endless()))
        # A __getitem__ that never returns is stopped as the function is.
        class Spinning:
            def __len__(self):
                return 10

            def __getitem__(self, i):
                while True:
                    pass

        refusal_within_5_s("spinning-schedule", Spinning())
        # A list says how far it got.
        pebble.register_policy("long-schedule",
                               lambda graph, options: [("compute", "conv1")] * 4_000_000)
        with self.assertRaises(ValueError) as e:
            pebble.plan(self.graph, policy="long-schedule", time_limit=0.5)
        self.assertRegex(str(e.exception), r"\d+ of its 4000000 steps read")

    def test_a_daemon_thread_in_a_python_policy_at_exit_is_no_crash(self):
        # The interpreter exits while a daemon thread runs a policy (and a
        # plan inside it): CPython ends that thread inside pebble's C++ when
        # it waits for the GIL. 7 runs in 8 aborted (SIGABRT or SIGSEGV).
        code = """
            import threading, time, pebble
            g = pebble.model("tanh-chain:length=4,size=1000")
            def busy(graph, options):
                start = time.time()
                while time.time() - start < 5:
                    pass
                return pebble.plan(graph, policy="dfs").schedule
            pebble.register_policy("busy", busy)
            pebble.register_policy("busy2", busy)
            for _ in range(2):
                threading.Thread(target=lambda: pebble.plan(g, policy="busy", time_limit=30),
                                 daemon=True).start()
            # compare's policies run on TBB's threads, which swallowed CPython's
            # unwind of them ("FATAL: exception not rethrown")
            threading.Thread(target=lambda: pebble.compare(g, policies=["busy", "busy2"],
                                                           time_limit=30), daemon=True).start()
            time.sleep(0.3)
            print("exits")
        """
        for run in range(3):
            rc, out, err = run_python(code, timeout=30)
            self.assertEqual((rc, out), (0, "exits\n"), f"run {run}: status {rc}:\n{err}")

    def test_a_policy_blocked_in_a_c_call_is_stopped_when_the_call_returns(self):
        def sleeps(graph, options):
            time.sleep(1.5)
            return []

        pebble.register_policy("sleeps", sleeps)
        with self.assertRaises(ValueError) as e:
            pebble.plan(self.graph, policy="sleeps", time_limit=0.5)
        self.assertIn("time limit of 0.5 s", str(e.exception))

    def test_a_policy_within_its_time_limit_is_untouched(self):
        schedule = pebble.plan(self.graph, policy="baseline").schedule
        pebble.register_policy("quick", lambda graph, options: schedule)
        p = pebble.plan(self.graph, policy="quick", budget="min", time_limit=0.5)
        self.assertEqual(p.schedule, schedule)
        time.sleep(0.7)  # past the limit: no exception arrives late
        sum(range(1_000_000))

    def test_keyboard_interrupt_and_system_exit_reach_the_caller_as_themselves(self):
        calls = []

        def interrupted(graph, options):
            calls.append(1)
            raise KeyboardInterrupt

        def exits(graph, options):
            raise SystemExit(3)

        pebble.register_policy("interrupted", interrupted)
        pebble.register_policy("exits", exits)
        with self.assertRaises(KeyboardInterrupt):
            pebble.plan(self.graph, policy="interrupted")
        with self.assertRaises(SystemExit) as e:
            pebble.plan(self.graph, policy="exits")
        self.assertEqual(e.exception.code, 3)
        for jobs in (1, 4):
            calls.clear()
            with self.assertRaises(KeyboardInterrupt):
                pebble.compare(self.graph, policies=["best-order", "interrupted"],
                               budgets=["100%", "80%", "60%", "min"], jobs=jobs)
            if jobs == 1:  # no Python policy runs after the interrupt
                self.assertEqual(len(calls), 1)
        with self.assertRaises(KeyboardInterrupt):
            pebble.fit("conv3d", "n", "64MiB", policies=["interrupted"], max=64)
        # The module works on afterwards.
        self.assertTrue(pebble.plan(self.graph).feasible)

    def test_ctrl_c_in_a_policy_is_a_keyboard_interrupt(self):
        code = """
            import os, signal, threading, pebble
            g = pebble.model("resnet18:batch=1,image=32")
            def endless(graph, options):
                while True:
                    pass
            pebble.register_policy("endless", endless)
            threading.Timer(0.5, lambda: os.kill(os.getpid(), signal.SIGINT)).start()
            try:
                pebble.plan(g, policy="endless", time_limit=30)
            except KeyboardInterrupt:
                print("KeyboardInterrupt")
        """
        rc, out, err = run_python(code, timeout=20)
        self.assertEqual((rc, out.strip()), (0, "KeyboardInterrupt"), err)

    def test_the_policy_error_keeps_the_exception_as_its_cause(self):
        def raises(graph, options):
            raise RuntimeError("no plan\ntoday")

        pebble.register_policy("raises", raises)
        with self.assertRaises(ValueError) as e:
            pebble.plan(self.graph, policy="raises")
        message = str(e.exception)
        self.assertIn("policy 'raises' raised RuntimeError: no plan\\ntoday", message)
        self.assertNotIn("\n", message)
        self.assertIsInstance(e.exception.__cause__, RuntimeError)
        self.assertIsNotNone(e.exception.__cause__.__traceback__)

    def test_a_policy_that_plans_with_itself_is_refused_once(self):
        # (its message grew by a level per call, to the 10,000-character cap,
        # the innermost cause lost)
        def plans_with(policy, call="plan"):
            def fn(graph, options):
                if call == "plan":
                    return pebble.plan(graph, policy=policy, budget="min").schedule
                # (two rows: compare's workers run them, in other threads)
                rows = pebble.compare(graph, policies=[policy, "dfs"], budgets=["min"],
                                      jobs=2)
                raise RuntimeError(rows[0]["error"])
            return fn

        pebble.register_policy("itself", plans_with("itself"))
        pebble.register_policy("ping", plans_with("pong"))
        pebble.register_policy("pong", plans_with("ping"))
        pebble.register_policy("compares", plans_with("compares", call="compare"))
        pebble.register_policy("compares-ping", plans_with("ping", call="compare"))
        pebble.register_policy("inner", lambda g, o: pebble.plan(g, policy="dfs").schedule)
        pebble.register_policy("outer", plans_with("inner"))
        for policy in ("itself", "ping", "compares", "compares-ping"):
            with self.assertRaises(ValueError) as e:
                pebble.plan(self.graph, policy=policy, budget="min")
            self.assertIn("plans with itself", str(e.exception), policy)
            self.assertLess(len(str(e.exception)), 600, policy)
        self.assertTrue(pebble.plan(self.graph, policy="outer", budget="min").feasible)

    def test_the_policies_cannot_change_while_a_plan_runs(self):
        def registers(graph, options):
            pebble.register_policy("another", lambda g, o: [])
            return []

        def unregisters(graph, options):
            pebble.unregister_policy("unregisters")
            return []

        pebble.register_policy("registers", registers)
        pebble.register_policy("unregisters", unregisters)
        for policy in ("registers", "unregisters"):
            with self.assertRaises(ValueError) as e:
                pebble.plan(self.graph, policy=policy, budget="min")
            self.assertIn("while a plan", str(e.exception))
        self.assertNotIn("another", [p["name"] for p in pebble.policies()])


class ThreadTest(unittest.TestCase):
    """Plans made on several Python threads at once (the GIL is released
    while pebble plans)."""

    def test_two_threads_solving_checkmate_milps_at_once(self):
        # CBC's command reader keeps its place in process-wide statics: two
        # solves at once read each other's arguments, printed CBC's own
        # complaints ("No match for 0 - ? for list of commands"), lost their
        # time limit and read commands from stdin, which hung where stdin was
        # an open pipe, as it is here.
        code = textwrap.dedent("""
            import json, random, threading, pebble
            def graph(r):
                nodes = [{"id": f"n{i}", "bytes": r.choice([1, 7, 100, 1000, 5000]),
                          "cost": r.choice([0, 0.5, 1, 3]),
                          "inputs": r.sample([f"n{j}" for j in range(i)], min(i, 2))}
                         for i in range(r.randint(4, 14))]
                return pebble.from_json(json.dumps({
                    "format": "pebble-graph", "version": 1, "nodes": nodes,
                    "outputs": [nodes[-1]["id"]]}))
            graphs = [graph(random.Random(seed)) for seed in range(20)]
            def work():
                for g in graphs:
                    for budget in ("80%", "60%"):
                        pebble.plan(g, policy="checkmate", budget=budget, time_limit=5)
            threads = [threading.Thread(target=work) for _ in range(2)]
            for t in threads:
                t.start()
            for t in threads:
                t.join()
            print("done")
        """)
        child = subprocess.Popen([sys.executable, "-c", code], stdin=subprocess.PIPE,
                                 stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        try:
            out, err = child.communicate(timeout=120)  # (stdin stays open until then)
        except subprocess.TimeoutExpired:
            child.kill()
            child.communicate()
            self.fail("two threads solving checkmate's MILPs did not finish within 120 s")
        self.assertEqual((child.returncode, out), (0, "done\n"), err)
        self.assertEqual(err, "")


class ArgumentTest(unittest.TestCase):
    """Every argument of every function: a wrong type or an out-of-range value
    is a ValueError that names the argument."""

    @classmethod
    def setUpClass(cls):
        cls.graph = pebble.model(MODEL)

    def assert_names(self, call, argument):
        with self.assertRaises(ValueError) as e:
            call()
        self.assertIn(argument, str(e.exception))
        return str(e.exception)

    def test_out_of_range_budgets_have_the_cli_message(self):
        for budget in (2**64, 2**63, -1, 10**30):
            with self.subTest(budget=budget):
                message = self.assert_names(lambda: pebble.plan(self.graph, budget=budget),
                                            "budget")
                self.assertEqual(message, cli_error("plan", "--model", MODEL,
                                                    f"--budget={budget}"))
        self.assert_names(lambda: pebble.compare(self.graph, budgets=[2**64]), "budget")
        self.assert_names(lambda: pebble.fit("conv3d", "n", 2**64), "budget")
        self.assert_names(lambda: pebble.plan(self.graph, host_budget=2**64), "host_budget")
        self.assert_names(lambda: pebble.plan(self.graph, budget=10**5000), "budget")

    def test_integers(self):
        g = self.graph
        for value in (2**64, 2**63, -1, 1.5, "1", True, None):
            with self.subTest(value=value):
                self.assert_names(lambda: pebble.plan(g, seed=value), "seed")
                self.assert_names(lambda: pebble.compare(g, seed=value), "seed")
                self.assert_names(lambda: pebble.compare(g, jobs=value), "jobs")
                self.assert_names(lambda: pebble.fit("conv3d", "n", "64MiB", jobs=value), "jobs")
                self.assert_names(lambda: pebble.fit("conv3d", "n", "64MiB", start=value),
                                  "start")
                self.assert_names(lambda: pebble.fit("conv3d", "n", "64MiB", max=value), "max")
                if value is not None:  # None: the model's own batch
                    self.assert_names(lambda: pebble.import_onnx("m.onnx", batch=value),
                                      "batch")
        self.assert_names(lambda: pebble.compare(g, jobs=5000), "jobs")
        self.assert_names(lambda: pebble.fit("conv3d", "n", "64MiB", start=0), "start")
        self.assert_names(lambda: pebble.import_onnx("m.onnx", batch=0), "batch")

        class Index:  # numpy integers look like this
            def __index__(self):
                return 7

        self.assertEqual(pebble.plan(g, seed=Index(), budget="min", policy="rotor").feasible,
                         True)
        self.assertEqual(pebble.plan(g, budget=Index(), policy="baseline").budget_bytes, 7)

    def test_more_jobs_than_threads_run_as_many_as_there_are(self):
        # (TBB printed a warning for an arena above its workers' limit)
        code, out, err = run_python("""
            import pebble
            g = pebble.model("linear:n=8")
            rows = pebble.compare(g, policies=["rotor", "dtr", "sqrtn"],
                                  budgets=["min", "80%"], jobs=4096)
            fit = pebble.fit("linear", "n", "4KiB", policies=["rotor", "dtr"], max=64,
                             jobs=4096)
            print(len(rows), len(fit["results"]))
            """)
        self.assertEqual((code, out.strip(), err), (0, "6 2", ""))

    def test_numbers_and_flags(self):
        g = self.graph
        for value in (0, -1, float("nan"), float("inf"), "1", None, True, 10**400):
            with self.subTest(value=value):
                self.assert_names(lambda: pebble.plan(g, time_limit=value), "time_limit")
                self.assert_names(lambda: pebble.compare(g, time_limit=value), "time_limit")
                self.assert_names(lambda: pebble.fit("conv3d", "n", "64MiB", time_limit=value),
                                  "time_limit")
                self.assert_names(lambda: pebble.model(MODEL, throughput=value), "throughput")
                self.assert_names(lambda: pebble.fit("conv3d", "n", "64MiB", throughput=value),
                                  "throughput")
        for value in (1, 0, "yes", None):
            with self.subTest(value=value):
                self.assert_names(lambda: pebble.plan(g, timeline=value), "timeline")
                self.assert_names(lambda: pebble.plan(g, own_order=value), "own_order")
                self.assert_names(lambda: pebble.compare(g, own_order=value), "own_order")
                self.assert_names(lambda: pebble.simulate(g, [], timeline=value), "timeline")
        for value in (float("nan"), [25e9], True, "fast"):
            with self.subTest(value=value):
                self.assert_names(lambda: pebble.plan(g, bandwidth=value), "bandwidth")
                self.assert_names(lambda: pebble.simulate(g, [], bandwidth=value), "bandwidth")
        self.assertEqual(pebble.plan(g, bandwidth=55e9).document["bandwidth_bytes_per_s"], 55e9)
        self.assertEqual(pebble.plan(g, time_limit=5).feasible, True)

    def test_a_bare_budget_under_1024_is_refused_as_the_cli_refuses_it(self):
        # A str reads as the command line's --budget; an int is bytes.
        for budget in ("70", " 70 ", "0.6"):
            with self.subTest(budget=budget):
                message = self.assert_names(lambda: pebble.plan(self.graph, budget=budget),
                                            "did you mean")
                self.assertIn("%", message)
                self.assert_names(lambda: pebble.compare(self.graph, budgets=[budget]),
                                  "did you mean")
        message = self.assert_names(lambda: pebble.fit("conv3d", "n", "70"), "did you mean")
        self.assertIn("70MiB", message)
        self.assertEqual(pebble.plan(self.graph, budget=70, policy="baseline").budget_bytes, 70)
        self.assertEqual(pebble.plan(self.graph, budget="70B", policy="baseline").budget_bytes,
                         70)

    def test_numbers_of_any_numeric_type(self):
        class Float:  # numpy's float32 looks like this: __float__, no float subclass
            def __init__(self, x):
                self.x = x

            def __float__(self):
                return self.x

        g = self.graph
        self.assertEqual(pebble.plan(g, bandwidth=Float(55e9)).document["bandwidth_bytes_per_s"],
                         55e9)
        self.assert_names(lambda: pebble.plan(g, bandwidth=Float(float("nan"))), "bandwidth")
        for zero in (0, 0.0, fractions.Fraction(0), Float(0.0)):
            with self.subTest(latency=zero):
                self.assertEqual(pebble.collective_seconds("all_reduce", 1000, 2,
                                                           network_latency=zero),
                                 pebble.collective_seconds("all_reduce", 1000, 2,
                                                           network_latency=0.0))
        self.assert_names(lambda: pebble.collective_seconds("all_reduce", 1000, 2,
                                                            network_latency=Float(-1.0)),
                          "network_latency")

    def test_a_sharded_graph_is_planned_with_the_link_it_was_timed_for(self):
        sharded = pebble.shard(pebble.with_optimizer(pebble.model("mnist-cnn:batch=2"), "adam"), 2)
        message = self.assert_names(lambda: pebble.plan(sharded, ranks=2, network="ib-ndr"),
                                    "network")
        self.assertIn("sharded already", message)
        self.assert_names(lambda: pebble.compare(sharded, policies=["baseline"], ranks=2,
                                                 network="ib-ndr"), "network")
        # A link that equals the default is a link given; latency is named
        # as itself; simulate checks it too.
        fast = pebble.shard(pebble.with_optimizer(pebble.model("mnist-cnn:batch=2"), "adam"), 2,
                            network="ib-ndr")
        self.assertTrue(pebble.plan(fast, ranks=2, network="ib-ndr").feasible)
        self.assert_names(lambda: pebble.plan(fast, ranks=2, network="ethernet-100g"),
                          "network")
        self.assert_names(lambda: pebble.plan(sharded, ranks=2, network_latency=1e-3),
                          "network_latency")
        plan = pebble.plan(sharded, ranks=2)
        self.assertTrue(plan.feasible)
        self.assert_names(lambda: pebble.simulate(sharded, plan.schedule, ranks=2,
                                                  network_latency=1e-3), "network_latency")
        self.assertEqual(pebble.simulate(sharded, plan.schedule, ranks=2)["peak_bytes"],
                         plan.report["peak_bytes"])
        # On one rank: one rank's part of the step, as a policy of its own plans it.
        self.assertTrue(pebble.plan(sharded, policy="fsdp-blocks", budget="min").feasible)

    def test_strings_lists_and_graphs(self):
        g = self.graph
        for call, argument in [
            (lambda: pebble.plan("resnet18"), "graph"),
            (lambda: pebble.plan(None), "graph"),
            (lambda: pebble.simulate(json.loads(g.to_json()), []), "graph"),
            (lambda: pebble.compare(3), "graph"),
            (lambda: pebble.train(g.to_json()), "graph"),
            (lambda: pebble.plan(g, policy=3), "policy"),
            (lambda: pebble.plan(g, budget=1.5), "budget"),
            (lambda: pebble.plan(g, budget=None), "budget"),
            (lambda: pebble.plan(g, host_budget=1.5), "host_budget"),
            (lambda: pebble.plan(g, host_budget="60%"), "host_budget"),
            (lambda: pebble.plan(g, policy=""), "policy"),
            (lambda: pebble.compare(g, policies=[]), "policies"),
            (lambda: pebble.fit("conv3d", "n", "64MiB", policies=[]), "policies"),
            (lambda: pebble.compare(g, policies="rotor"), "policies"),
            (lambda: pebble.compare(g, policies=["rotor", 3]), "policies[1]"),
            (lambda: pebble.compare(g, budgets="60%"), "budgets"),
            (lambda: pebble.compare(g, budgets=["60%", 1.5]), "budgets[1]"),
            (lambda: pebble.fit(3, "n", "64MiB"), "model"),
            (lambda: pebble.fit("conv3d", None, "64MiB"), "vary"),
            (lambda: pebble.fit("conv3d", "n", "64MiB", policies=("rotor", None)), "policies[1]"),
            (lambda: pebble.model(b"resnet18"), "spec"),
            (lambda: pebble.model("resnet18\0x"), "spec"),
            (lambda: pebble.model("resnet18\udc80"), "spec"),
            (lambda: pebble.load(3), "path"),
            (lambda: pebble.load("g.json\0.txt"), "path"),
            (lambda: pebble.from_json(b"{}"), "text"),
            (lambda: pebble.import_onnx(None), "path"),
            (lambda: pebble.import_onnx("m.onnx", loss=3), "loss"),
            (lambda: pebble.train(g, loss=None), "loss"),
            (lambda: pebble.register_policy(3, lambda g, o: []), "name"),
            (lambda: pebble.register_policy("p", 3), "fn"),
            (lambda: pebble.register_policy("p", lambda g, o: [], description=3), "description"),
            (lambda: pebble.register_policy("p", lambda g, o: [], kind=None), "kind"),
            (lambda: pebble.unregister_policy(3), "name"),
        ]:
            with self.subTest(argument=argument):
                self.assert_names(call, argument + ":")

    def test_paths_may_be_path_like(self):
        import pathlib
        path = pathlib.Path(ROOT, "examples", "mlp.json")
        self.assertEqual(pebble.load(path).to_json(), pebble.load(str(path)).to_json())
        self.assertEqual(pebble.load(os.fsencode(path)).to_json(), pebble.load(path).to_json())


class NameTest(unittest.TestCase):
    """A NUL used to cut a message short; other control characters made it
    several lines."""

    @classmethod
    def setUpClass(cls):
        cls.graph = pebble.model(MODEL)

    def test_nul_and_control_characters_in_policy_names(self):
        with self.assertRaises(ValueError) as e:
            pebble.register_policy("a\0b", lambda g, o: [])
        self.assertIn("'a\\x00b'", str(e.exception))
        with self.assertRaises(ValueError) as e:
            pebble.register_policy("a\nb", lambda g, o: [])
        self.assertIn("'a\\nb'", str(e.exception))
        self.assertIn("must be 1 to 64 letters", str(e.exception))
        with self.assertRaises(ValueError) as e:
            pebble.unregister_policy("a\x01b")
        self.assertIn("a\\x01b", str(e.exception))
        for policy in ("no\nsuch", "no\tsuch\x7f"):
            with self.subTest(policy=policy):
                with self.assertRaises(ValueError) as e:
                    pebble.plan(self.graph, policy=policy)
                self.assertEqual(str(e.exception), cli_error("plan", "--model", MODEL,
                                                             "--policy", policy))

    def test_a_nul_in_an_exec_policy_is_refused_not_cut(self):
        with tempfile.TemporaryDirectory() as d:
            marker = os.path.join(d, "ran")
            with self.assertRaises(ValueError) as e:
                pebble.plan(self.graph, policy=f"exec:touch {marker}\0; true")
            self.assertIn("policy:", str(e.exception))
            self.assertIn("NUL", str(e.exception))
            self.assertFalse(os.path.exists(marker))


class HugeGraphTest(unittest.TestCase):
    """Percentage budgets resolve exactly, however large the peak."""

    def test_100_percent_is_the_baseline_peak(self):
        # 4503599627365503 x 100.0 / 100.0 is one byte less in doubles.
        peak = 4503599627365503
        g = one_node_graph(peak)
        p = pebble.plan(g)
        self.assertEqual(p.baseline_peak_bytes, peak)
        self.assertEqual(p.budget_bytes, peak)
        self.assertEqual(p.policy, "best-order")
        self.assertTrue(p.feasible)
        self.assertEqual(p.report["transfer_bytes"], 0)
        rows = pebble.compare(g, policies=["baseline"], budgets=["100%", "50%", "12.5%"])
        self.assertEqual([r["budget_bytes"] for r in rows], [peak, peak // 2, peak // 8])
        self.assertTrue(rows[0]["feasible"])
        # 1000000000000002 x 50.0 / 100.0 fell below the half in doubles.
        g = one_node_graph(10**15 + 2)
        self.assertEqual(pebble.plan(g, budget="50%", policy="baseline").budget_bytes,
                         (10**15 + 2) // 2)


class OddInputTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.graph = pebble.model(MODEL)

    def test_odd_schedules(self):
        g = self.graph
        node = g.ids[0]
        circular = []
        circular.append(circular)
        deep = []
        for _ in range(200):
            deep = [deep]
        for schedule, words in [
            (5, "schedule"),
            ("compute", "schedule"),
            (b"compute", "schedule"),
            ((s for s in [("compute", node)]), "schedule"),
            ([("compute", node, "x")], "step 0"),
            ([("compute", 5)], "step 0"),
            ([("compute", float("nan"))], "step 0"),
            ([{"action": "compute", "node": node, "extra": 1}], "extra"),
            ({"format": "pebble-schedule", "version": float("nan"), "steps": []}, "schedule"),
            ({"format": "pebble-schedule", "version": 1, "steps": circular}, "schedule"),
            ([("compute", deep)], "step 0"),
            ({1: 2}, "schedule"),
            ([("compute", node + "\0")], "\\x00"),
            ([("compute", object())], "step 0"),
        ]:
            with self.subTest(schedule=repr(schedule)[:40]):
                with self.assertRaises(ValueError) as e:
                    pebble.simulate(g, schedule)
                self.assertIn(words, str(e.exception))
                self.assertNotIn("\n", str(e.exception))
        # A parameter that is not an integer is said to be the wrong vary.
        with self.assertRaises(ValueError) as e:
            pebble.fit("resnet18:batch=2,image=32", "optimizer", "64MiB", max=4)
        self.assertTrue(str(e.exception).startswith("vary 'optimizer': "), e.exception)
        self.assertIn("vary takes an integer parameter of the model", str(e.exception))

    def test_odd_graph_texts(self):
        for text, words in [
            ("", "line 1"),
            ("{}\0{}", "NUL"),
            ("[" * 100000, "deep"),
            ('{"format": "pebble-graph", "version": 1, "nodes": [], "outputs": []}\ud800', "text"),
            (json.dumps({"format": "pebble-graph", "version": 1, "name": "x\ny",
                         "nodes": [{"id": "a\nb", "op": "generic", "bytes": -1}],
                         "outputs": ["a\nb"]}), "a\\nb"),
        ]:
            with self.subTest(text=text[:30]):
                with self.assertRaises(ValueError) as e:
                    pebble.from_json(text)
                self.assertIn(words, str(e.exception))
                self.assertNotIn("\n", str(e.exception))

    def test_odd_paths(self):
        with tempfile.TemporaryDirectory() as d:
            for call in (pebble.load, pebble.import_onnx):
                with self.subTest(call=call.__name__):
                    with self.assertRaises(ValueError) as e:
                        call(d)
                    self.assertIn("directory", str(e.exception))
                    with self.assertRaises(ValueError) as e:
                        call(os.path.join(d, "missing\nfile"))
                    self.assertIn("missing\\nfile", str(e.exception))
            bad = os.fsencode(d) + b"/\xff.json"
            with open(bad, "w") as f:
                f.write("{")
            with self.assertRaises(ValueError) as e:
                pebble.load(bad)
            self.assertIn("\\xff", str(e.exception))

    def test_fit_with_a_bad_vary(self):
        for model, vary, words in [("conv3d", "", "vary"), ("conv3d", "nosuch", "nosuch"),
                                   ("conv3d", "n\nx", "n\\nx"), ("unet3d", "variant", "variant")]:
            with self.subTest(vary=vary):
                with self.assertRaises(ValueError) as e:
                    pebble.fit(model, vary, "64MiB", max=4)
                self.assertIn(words, str(e.exception))
                self.assertNotIn("\n", str(e.exception))

    def test_a_graph_made_to_collide_with_another_gets_its_own_order(self):
        # best-order remembers exact-order's order by a hash of the graph.
        # The hash was invertible step by step: sizes solved for made B's
        # hash A's, and B planned after A got A's order (99 bytes above its
        # own optimum), marked as remembered. The hash is now seeded anew
        # in each process.
        def graph(a1, c1):
            return pebble.from_json(json.dumps({
                "format": "pebble-graph", "version": 1, "nodes": [
                    {"id": "s", "bytes": 1},
                    {"id": "a1", "bytes": a1, "inputs": ["s"]},
                    {"id": "a2", "bytes": 100, "inputs": ["a1"]},
                    {"id": "c1", "bytes": c1, "inputs": ["s"]},
                    {"id": "c2", "bytes": 100, "inputs": ["c1"]},
                    {"id": "j", "bytes": 1, "inputs": ["a2", "c2"]}],
                "outputs": ["j"]}))
        pebble.plan(graph(1000000, 10), policy="best-order", budget="min")
        b = pebble.plan(graph(1604, 4280752293686304), policy="best-order", budget="min")
        exact = [c for c in b.details["candidates"] if c.get("policy") == "exact-order"]
        self.assertEqual([(c["peak_bytes"], c.get("remembered", False)) for c in exact],
                         [(4280752293686405, False)])

    def test_a_policy_or_budget_named_twice_is_refused(self):
        g = pebble.model("tanh-chain:length=4,size=1000")
        self.assertEqual(cli_error("compare", "--model", "tanh-chain:length=4,size=1000",
                                   "--policies", "rotor,rotor"),
                         "'rotor,rotor' names the policy 'rotor' twice")
        for call, culprit in [
                (lambda: pebble.compare(g, policies=["rotor", "dtr", "rotor"]), "policies[2]"),
                (lambda: pebble.compare(g, budgets=["60%", "min", "60%"]), "budgets[2]"),
                (lambda: pebble.fit("tanh-chain:size=1000", "length", "1MiB",
                                    policies=["baseline", "baseline"]), "policies[1]")]:
            with self.assertRaises(ValueError) as e:
                call()
            self.assertTrue(str(e.exception).startswith(culprit + ": names the "), e.exception)
            self.assertIn("twice", str(e.exception))

    def test_a_host_rate_too_slow_is_named(self):
        # (the graph's check named an optimizer state's node, not the argument)
        training = pebble.model("tanh-chain:length=4,size=1000")
        with self.assertRaises(ValueError) as e:
            pebble.with_optimizer(training, "adam:updates=host", host_bytes_per_s=1e-305)
        self.assertTrue(str(e.exception).startswith("host_bytes_per_s: 1e-305 bytes per "
                                                    "second is too slow"), e.exception)

    def test_a_built_in_policy_cannot_be_unregistered(self):
        with self.assertRaises(ValueError) as e:
            pebble.unregister_policy("rotor")
        self.assertEqual(str(e.exception),
                         "'rotor' is a built-in policy, which cannot be unregistered")
        self.assertIn("rotor", [p["name"] for p in pebble.policies()])
        with self.assertRaises(ValueError) as e:
            pebble.unregister_policy("never-registered")
        self.assertIn("no outside policy 'never-registered'", str(e.exception))

    def test_fit_takes_the_milp_cap_its_notes_advise(self):
        # checkmate's refusal advises milp_max_stages: fit takes it.
        capped = pebble.fit("tanh-chain:size=1000", "length", "1MiB", policies=["checkmate"],
                            time_limit=60)["results"][0]
        self.assertIn("milp_max_stages", capped["note"])
        raised = pebble.fit("tanh-chain:size=1000", "length", "1MiB", policies=["checkmate"],
                            milp_max_stages=400, time_limit=60)["results"][0]
        self.assertGreater(raised["value"], capped["value"])
        with self.assertRaises(ValueError):
            pebble.fit("tanh-chain", "length", "1MiB", milp_max_stages=-1)

    def test_a_policy_returning_odd_things(self):
        for name, result in [("none", None), ("number", 3), ("nan", [("compute", math.nan)]),
                             ("generator", (x for x in [])), ("bytes", b"xx")]:
            with self.subTest(result=name):
                pebble.register_policy("odd", lambda g, o, r=result: r)
                try:
                    with self.assertRaises(ValueError) as e:
                        pebble.plan(self.graph, policy="odd")
                    self.assertIn("policy 'odd'", str(e.exception))
                finally:
                    pebble.unregister_policy("odd")


if __name__ == "__main__":
    unittest.main()
