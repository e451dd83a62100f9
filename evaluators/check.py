"""The contract every domain keeps, checked through the real `Evaluator` and sandbox (no Ray).

`atoll check CONFIG` prints these; the scaffold's own test asserts them. Each
check scores real programs: the domain's seed and baselines on every split,
the seed again under the same and under other secrets, and a few bad or
hostile programs whose statuses and scores say whether the domain keeps its
data to itself. A failed check's detail says what to fix.
"""
from __future__ import annotations

import sys
import traceback
from dataclasses import dataclass
from itertools import combinations
from pathlib import Path

from evaluators._base import SPLITS, DoesNotHoldUp
from evaluators.evaluator import Evaluator
from evaluators.params import (
    ParamSpec,
    ProgramFormatError,
    read_params,
    write_param_specs,
)
from evaluators.registry import DomainConfig, domain_folders
from evaluators.sandbox.config import SandboxConfig
from evaluators.secrets import RunSecrets
from store.records import EvalResult, Status

_SECRETS, _OTHER_SECRETS = RunSecrets.fixed(271828), RunSecrets.fixed(314159)
_CRASH = "atoll-check: a deliberate crash"
_READ = "atoll-check: the candidate read"

_READER = '''

import os as _os
for _path in {targets!r}:
    try:
        _seen = _os.listdir(_path) if _os.path.isdir(_path) else open(_path, "rb").read(64)
    except OSError:
        continue
    if _seen:
        raise RuntimeError({marker!r} + " " + _path)
'''

_PATCHER = '''

import builtins as _bi, math as _m, numpy as _np
_SAVED = {{}}
ATOLL_IMPORTED = []


def _patch():
    for _mod, _names in ((_np, ("mean", "sum", "average", "std", "nanmean", "nansum")), (_m, ("fsum",)),
                         (_bi, ("sum", "max", "min"))):
        for _n in _names:
            _SAVED.setdefault((_mod, _n), getattr(_mod, _n))
            setattr(_mod, _n, lambda *a, **k: 1e12)
    for _name in ("evaluators.simple", "evaluators._base", "evaluators.evaluator"):
        try:
            _module = __import__(_name, fromlist=["_"])
        except Exception:
            continue
        ATOLL_IMPORTED.append(_name)
        for _attr in dir(_module):
            _obj = getattr(_module, _attr)
            if isinstance(_obj, type) and hasattr(_obj, "evaluate"):
                _obj.evaluate = lambda *a, **k: None


def _unpatch():
    for (_mod, _n), _f in _SAVED.items():
        setattr(_mod, _n, _f)


_honest = {entry}


def {entry}(*args):
    _unpatch()
    try:
        return _honest(*args)
    finally:
        _patch()


_patch()
'''


@dataclass(frozen=True)
class Check:
    """One line of the contract: what was checked, whether it held, and what was seen or what to fix."""

    name: str
    passed: bool
    detail: str


def _why(result: EvalResult) -> str:
    lines = (result.error or "").strip().splitlines()
    return f"{result.status.value}: {lines[-1][:160] if lines else 'no reason given'}"


def _same_start(a: EvalResult, b: EvalResult) -> bool:
    """Whether two splits' per-instance scores agree on every instance both have (one seed for both)."""
    n = min(len(a.instance_scores), len(b.instance_scores))
    return n > 0 and a.instance_scores[:n] == b.instance_scores[:n]


def _untuned(code: str) -> str:
    """`code` with each PARAMS range narrowed to its default, so tuning has nothing to choose and the score
    depends on the data alone; `code` itself when it has no PARAMS (or malformed ones: its result says so)."""
    try:
        specs = read_params(code)
    except ProgramFormatError:
        return code
    if not specs:
        return code
    return write_param_specs(code, {n: ParamSpec(n, s.default, s.default, s.default) for n, s in specs.items()})


def _scored(result: EvalResult) -> str:
    return f"{result.score:.6g}" if result.status == Status.OK else _why(result)


class Checker:
    """Runs the checks for one domain; `run()` returns them in order."""

    def __init__(self, domain: str | DomainConfig, sandbox: SandboxConfig, hide: tuple[str, ...] = ()):
        self.spec, self.sandbox, self.hide = domain, sandbox, tuple(hide)
        self.evaluator = self._evaluator(_SECRETS)
        self.domain = self.evaluator.domain
        self.seed: dict[str, EvalResult] = {}
        self.untuned: dict[str, EvalResult] = {}  # the seed at its PARAMS' defaults, on each split
        self.baselines: dict[str, dict[str, EvalResult]] = {}  # each baseline's result on each split

    def _evaluator(self, secrets: RunSecrets) -> Evaluator:
        return Evaluator(self.spec, {}, self.sandbox, self.hide, secrets=secrets)

    def run(self) -> list[Check]:
        checks = [self.seed_scores(), *self.baselines_score(), self.splits_differ(), self.deterministic(),
                  self.depends_on_secrets(), self.returns_nothing(), self.crashes(), self.no_entry_point(),
                  self.reads_files(), self.patches_scorer()]
        return checks

    @staticmethod
    def _evaluate(evaluator: Evaluator, label: str, code: str, split: str) -> EvalResult:
        """The evaluator's result; an exception of the domain's own becomes a FAILED result that says so."""
        try:
            return evaluator.evaluate(label, code, split)
        except Exception as exc:  # noqa: BLE001  the domain's bug is what the check reports
            where = traceback.extract_tb(exc.__traceback__)[-1]
            return EvalResult(label, split, Status.FAILED, error=f"the domain itself raised {type(exc).__name__}: "
                              f"{exc} ({Path(where.filename).name}, line {where.lineno})")

    def _seed_on(self, split: str) -> EvalResult:
        if split not in self.seed:
            self.seed[split] = self._evaluate(self.evaluator, "check-seed", self.domain.seed_program, split)
        return self.seed[split]

    def _untuned_on(self, split: str) -> EvalResult:
        """The seed at its PARAMS' defaults on `split` (the seed's own result when it has no PARAMS): a tuner
        seeded per split picks other parameters there, so only these tell whether the data differ."""
        fixed = _untuned(self.domain.seed_program)
        if fixed == self.domain.seed_program:
            return self._seed_on(split)
        if split not in self.untuned:
            self.untuned[split] = self._evaluate(self.evaluator, "check-seed-fixed", fixed, split)
        return self.untuned[split]

    def _on_every_split(self, label: str, results: dict[str, EvalResult], held: bool = False) -> Check:
        """Whether `results` (split -> result) all scored OK. With `held` (a baseline), a validation result the
        domain refused because the program does not hold up there (`DoesNotHoldUp`) passes, saying so: a
        weak baseline may fail the gate that keeps a program from being crowned."""
        weak = {split for split, r in results.items() if held and split == "validation"
                and r.status == Status.INVALID and DoesNotHoldUp.marks(r.error)}
        bad = {split: r for split, r in results.items() if r.status != Status.OK and split not in weak}
        if bad:
            split, result = next(iter(bad.items()))
            return Check(f"{label} scores OK on every split", False,
                         f"{split}: {_why(result)}. It must score on {', '.join(SPLITS)}: fix the domain "
                         "(its instances or simulator) or the program")
        return Check(f"{label} scores OK on every split", True, ", ".join(
            f"{split}: does not hold up, so it would not be crowned (the split's purpose): "
            f"{r.error[len(DoesNotHoldUp.MARK):][:240]}" if split in weak
            else f"{split} {r.score:.6g}" for split, r in results.items()))

    def seed_scores(self) -> Check:
        return self._on_every_split("seed program", {split: self._seed_on(split) for split in SPLITS})

    def baselines_score(self) -> list[Check]:
        baselines = self.domain.baselines()
        if not baselines:
            return [Check("the domain has baselines", False, "no baseline to compare the evolved best with: "
                          "add at least one program (SimpleDomain: baseline_programs)")]
        for name, code in baselines.items():
            self.baselines[name] = {split: self._evaluate(self.evaluator, f"check-baseline-{name}", code, split)
                                    for split in SPLITS}
        return [self._on_every_split(f"baseline {name!r}", results, held=True)
                for name, results in self.baselines.items()]

    def splits_differ(self) -> Check:
        """The seed's per-instance scores differ between the splits, measured at its PARAMS' defaults."""
        name = "the splits hold different instances"
        results = {split: self._untuned_on(split) for split in SPLITS}
        if any(r.status != Status.OK for r in results.values()):  # its defaults act out of range, say
            results = {split: self._seed_on(split) for split in SPLITS}
        if any(r.status != Status.OK for r in results.values()):
            return Check(name, False, "not measured: the seed program did not score on every split")
        # a seed that is the domain's yardstick (inventory's base-stock) scores alike on every instance: the
        # baselines that scored everywhere tell the splits apart too
        others = [r for r in self.baselines.values() if all(r[split].status == Status.OK for split in SPLITS)]
        alike = [(a, b) for a, b in combinations(SPLITS, 2) if _same_start(results[a], results[b])]
        same = [(a, b) for a, b in alike if all(_same_start(r[a], r[b]) for r in others)]
        if same:
            a, b = same[0]
            also = ", and so does every baseline" if others else ""
            return Check(name, False, f"the seed program scores the same on {a} and {b}, instance by instance "
                                      f"(on the instances both have){also}: build each split's instances from the "
                                      "rng that instances() receives")
        if alike:
            pairs = ", ".join(f"{a} and {b}" for a, b in alike)
            return Check(name, True, f"the seed's per-instance scores are alike on {pairs} (the scores' "
                                     "yardstick, say), a baseline's differ")
        return Check(name, True, "the seed's per-instance scores differ between " + ", ".join(SPLITS))

    def deterministic(self) -> Check:
        name = "the score is deterministic for fixed secrets"
        first = self._seed_on("search")
        if first.status != Status.OK:
            return Check(name, False, f"not measured: the seed program scored {_scored(first)}")
        again = self._evaluate(self._evaluator(_SECRETS), "check-seed-again", self.domain.seed_program, "search")
        if (first.status, first.score, first.instance_scores) == (again.status, again.score, again.instance_scores):
            return Check(name, True, f"search score {_scored(first)} twice")
        return Check(name, False, f"{_scored(first)}, then {_scored(again)} with the same secrets: draw every "
                                  "random number from the rng that instances() receives, not from numpy's "
                                  "global state, the clock or a set's order")

    def depends_on_secrets(self) -> Check:
        """The seed at its PARAMS' defaults under two secrets: the tuner's seed derives from the secrets too,
        so a tuned seed scored differently on public data (other parameters won) and passed. Data that
        the domain declares published or the user's own (`Domain.public_data`) pass, saying so."""
        name = "the data comes from the run's secrets"
        fixed = _untuned(self.domain.seed_program)
        first = self._untuned_on("search")
        other = self._evaluate(self._evaluator(_OTHER_SECRETS), "check-seed-other", fixed, "search")
        if first.status != Status.OK or other.status != Status.OK:
            return Check(name, False, f"not measured: the seed program scored {_scored(first)} and {_scored(other)}")
        if first.instance_scores == other.instance_scores and self.domain.public_data():
            return Check(name, True, f"the same scores under other secrets, as the config says: "
                                     f"{self.domain.public_data()}")
        if first.instance_scores == other.instance_scores:
            return Check(name, False, "the same per-instance scores under other secrets: the data is public, so a "
                                      "candidate could rebuild it; draw it from the rng that instances() receives "
                                      "(or from domain.secrets)")
        at = " at its PARAMS' defaults" if fixed != self.domain.seed_program else ""
        return Check(name, True, f"search score{at} {first.score:.6g}, and {other.score:.6g} under other secrets")

    def _bad(self, name: str, code: str, expected: tuple[Status, ...], needle: str = "") -> Check:
        result = self._evaluate(self.evaluator, "check-bad", code, "search")
        ok = result.status in expected and needle in (result.error or "")
        want = " or ".join(s.value for s in expected)
        return Check(name, ok, _why(result) if ok or result.status != Status.OK else
                     f"scored OK ({result.score:.6g}); expected {want}: check every action before using it")

    def returns_nothing(self) -> Check:
        entry = self.domain.entry_point
        return self._bad("a policy that returns nothing is not scored",
                         f"def {entry}(*args):\n    return None\n", (Status.FAILED, Status.INVALID))

    def crashes(self) -> Check:
        entry = self.domain.entry_point
        return self._bad("a crashing policy is FAILED, with its error",
                         f"def {entry}(*args):\n    raise RuntimeError({_CRASH!r})\n", (Status.FAILED,), _CRASH)

    def no_entry_point(self) -> Check:
        return self._bad(f"a program without {self.domain.entry_point}() is INVALID",
                         "def something_else(*args):\n    return 0\n", (Status.INVALID,))

    def _hostile(self, name: str, code: str) -> tuple[Check | None, EvalResult, EvalResult]:
        seed = self._seed_on("search")
        result = self._evaluate(self.evaluator, "check-hostile", code, "search")
        if seed.status != Status.OK:
            return Check(name, False, f"not measured: the seed program scored {_scored(seed)}"), seed, result
        if result.status == Status.OK and result.score > seed.score:
            return Check(name, False, f"scored {result.score:.6g}, above the honest {seed.score:.6g}: the "
                                      "scoring depends on something the candidate's process can change"), seed, result
        return None, seed, result

    def reads_files(self) -> Check:
        name = "a policy that reads the domain's files gains nothing"
        targets = self.domain_files()
        code = self.domain.seed_program + _READER.format(targets=targets, marker=_READ)
        failed, seed, result = self._hostile(name, code)
        if failed:
            return failed
        if _READ in (result.error or ""):
            path = (result.error or "").split(_READ, 1)[1].split()[0]
            return Check(name, False, f"the candidate read {path}: keep the domain's files in its own folder "
                                      "(hidden from candidates) or list them in sandbox_hide(); the sandbox "
                                      "hides files only when it runs as root")
        return Check(name, True, f"none of {len(targets)} paths readable; scored {_scored(result)} "
                                 f"(honest {seed.score:.6g})")

    def domain_files(self) -> list[str]:
        """The domain's file, its folder and the paths it asks to hide."""
        paths = [*domain_folders(self.domain), *self.domain.sandbox_hide()]
        module = sys.modules.get(type(self.domain).__module__)
        if module is not None and getattr(module, "__file__", None):
            paths.insert(0, module.__file__)
        return list(dict.fromkeys(paths))

    def patches_scorer(self) -> Check:
        name = "a policy that patches the scorer gains nothing"
        code = self.domain.seed_program + _PATCHER.format(entry=self.domain.entry_point)
        failed, seed, result = self._hostile(name, code)
        if failed:
            return failed
        return Check(name, True, f"patched numpy and builtins in its own process; scored {_scored(result)} "
                                 f"(honest {seed.score:.6g})")


def run_checks(domain: str | DomainConfig, sandbox: SandboxConfig, hide: tuple[str, ...] = ()) -> list[Check]:
    """Every check of the contract for `domain`, in order."""
    return Checker(domain, sandbox, hide).run()
