"""Chapter 8's hypotheses H1 to H5, each read by the rule stated before its runs.

Chapter 8 asks why removal credit ends behind winner-take-all credit in its grid. Its box of
hypotheses (section ``ch08-hypotheses``, committed before any of the runs it predicts) states
for each one the measurement, the prediction and what refutes it. This module applies those
rules to whatever has been recorded, and says "not read" while the runs a rule needs are
missing, so that no reading is made on part of the data:

- :func:`read_h1`, standardisation: centred removal - winner-take-all in deployed accuracy over
  seeds 0 to 9 (:func:`mcpg.grpo.verdict.seed_verdict`);
- :func:`read_h2`, the escape into cut answers: the mean advantage ``a_fin`` of the finished
  completions in groups with no right candidate, over the first 12 updates of the standardised
  removal replays (:func:`mcpg.grpo.escape.finish_advantages`), whether the cut share follows
  it (:func:`mcpg.grpo.escape.follows`), and the contrast with the centred removal runs' cut
  failures (:func:`mcpg.grpo.verdict.cut_failures`);
- :func:`read_h3`, exact credit: the oracle against both signals on seeds 0 to 2, per scaling,
  and the same rule on seeds 0 to 9 (the third box: ``read_h3(runs, SEEDS)``);
- :func:`read_h4`, dropouts: the share of removal runs with an agent below 10 % held-out
  accuracy, centred against standardised (:func:`mcpg.grpo.verdict.dropouts`);
- :func:`read_h5`, the rollout's scale (TRL's ``scale_rewards="batch"``): whether dividing by
  the agent's spread over the whole rollout, instead of each group's own, shrinks removal's
  deficit, its cut failures and its dropouts against standardised removal, with the check that
  it does shrink the finished answers' advantage in hopeless groups;
- :func:`read_twin`: the fourth box, chapter 7's twin's predictions against the ten-seed
  intervals (each difference *agrees* when chapter 8's interval contains the twin's mean), and
  whether H3 refutes the twin;
- :func:`read_hypotheses`: all of them as one table, one row per reading; H5, withdrawn in the
  third box before any of its runs existed, reads ``withdrawn`` (:data:`H5_WITHDRAWN`).

Every reading is a dict with ``hypothesis``, ``measurement`` (what was computed, with its
numbers), ``reading`` (``supported``, ``refuted``, ``undecided``, ``consistent`` where the box
names only what refutes, H3's loser, ``holds`` or ``fails`` for H5's check of its manipulation,
or ``not read``) and ``why`` (the rule that gave the reading).
"""

from __future__ import annotations

import pandas as pd

from ..stats import paired_difference
from .escape import finish_advantages, follows, pooled_fin
from .rundir import Run
from .verdict import cut_failures, dropouts, paired_seeds, seed_verdict

__all__ = ["SEEDS", "ORACLE_SEEDS", "REPLAYED", "H1_PREDICTION", "H5_WITHDRAWN", "read_h1", "read_h2",
           "read_h3", "read_h4", "read_h5", "read_twin", "read_hypotheses"]

SEEDS = tuple(range(10))
"""The seeds of the grid of record (H1, the H2 contrast and H4 are read on all ten)."""
ORACLE_SEEDS = (0, 1, 2)
"""The oracle's seeds under each scaling (H3)."""
REPLAYED = (0, 3, 6, 9)
"""The standardised removal seeds replayed with each candidate's cut flag for H2; 3 collapsed,
6 failed a cut measure, 0 and 9 were healthy."""
H1_PREDICTION = 0.07
"""The low end of chapter 7's simulated prediction for centred removal - winner-take-all."""
UPDATES = 12
"""The replayed updates (H2)."""
H5_WITHDRAWN = ("withdrawn in the third box (2026-12-07) before any batch run existed: H1 refuted "
                "standardisation as the reason removal loses")
"""Why H5 is not read (chapter 8's third box)."""


def _bounds(mean, low, high) -> str:
    return f"{mean:+.3f} [{low:+.3f}, {high:+.3f}]"


def _seeds(runs: list[Run], arm: str) -> set[int]:
    return {int(r.config.get("seed", 0)) for r in runs if r.arm == arm and r.eval is not None}


def _on(runs: list[Run], seeds) -> list[Run]:
    """The runs on ``seeds``: a rule reads the seeds it names and no other."""
    return [r for r in runs if int(r.config.get("seed", 0)) in seeds]


def _missing(runs: list[Run], arms, seeds) -> list[str]:
    """``arm seed k`` for each finished run that the rule needs and that is not there."""
    return [f"{arm} seed {s}" for arm in arms for s in seeds if s not in _seeds(runs, arm)]


def _not_read(h: str, measurement: str, missing: list[str]) -> dict:
    return {"hypothesis": h, "measurement": measurement, "reading": "not read",
            "why": f"{len(missing)} of its runs not recorded yet ({', '.join(missing[:3])}"
                   f"{', ...' if len(missing) > 3 else ''})"}


def read_h1(runs: list[Run], seeds=SEEDS, prediction: float = H1_PREDICTION) -> dict:
    """H1: centred, removal - winner-take-all in deployed accuracy over ``seeds`` is >= 0.
    Refuted if the interval lies below 0, supported if above; otherwise undecided, and the
    reading says whether the interval also excludes chapter 7's ``prediction``."""
    measurement = "centred removal − winner-take-all, deployed, over seeds 0 to 9"
    missing = _missing(runs, ("wta-none", "removal-none"), seeds)
    if missing:
        return _not_read("H1", measurement, missing)
    v = seed_verdict(_on(runs, seeds), scaling="none")
    d = v.loc["deployed"]
    mean, low, high = float(d["mean"]), float(d["low"]), float(d["high"])
    if high < 0:
        reading, why = "refuted", "the interval lies below 0"
    elif low > 0:
        reading, why = "supported", "the interval lies above 0"
    else:
        reading = "undecided"
        why = (f"the interval contains 0; it {'excludes' if high < prediction else 'contains'} "
               f"chapter 7's +{prediction:.2f}")
    return {"hypothesis": "H1", "measurement": f"{measurement}: {_bounds(mean, low, high)}",
            "reading": reading, "why": why, "mean": mean, "low": low, "high": high, "n": int(d["n"])}


def _cut_count(runs, sc) -> int:
    return int(cut_failures(runs, scaling=sc, signals=("removal",))["removal"].sum())


def _drop_count(runs, sc) -> int:
    return int((dropouts(runs).xs(f"removal-{sc}", level="arm")["dropped"] > 0).sum())


def read_h2(runs: list[Run], replays: list[Run], seeds=SEEDS, replayed=REPLAYED, updates: int = UPDATES,
            n_perm: int = 10_000) -> list[dict]:
    """H2 in three readings: H2a (``a_fin`` < 0 in the standardised removal replays; refuted if
    it is >= 0 pooled over the replays, or in seed 3 or seed 6, and otherwise *consistent*, since
    the box names only what refutes it; with the t-interval of the replays' own ``a_fin``), H2b
    (the mean per-replay Spearman of ``a_fin(t)`` against ``c(t+1) - c(t)`` is < 0: refuted if
    >= 0, supported if < 0 with a permutation p < 0.05, else undecided) and the contrast (centred
    removal fails a cut measure on fewer of ``seeds`` than standardised removal; refuted if as many
    or more)."""
    out = []
    have = {int(r.config.get("seed", 0)): r for r in replays if r.arm == "removal-group"}
    missing = [f"removal-group replay seed {s}" for s in replayed
               if s not in have or len(have[s].slates) < updates]
    m_a = f"ā_fin over updates 1 to {updates} of the standardised removal replays (seeds " \
          f"{', '.join(map(str, replayed))})"
    m_b = "mean per-replay Spearman of ā_fin(t) against c(t+1) − c(t)"
    if missing:
        out += [_not_read("H2a", m_a, missing), _not_read("H2b", m_b, missing)]
    else:
        frames = {s: finish_advantages(have[s]).loc[:updates] for s in replayed}
        pooled = pooled_fin(frames)
        each = {s: pooled_fin({s: f}) for s, f in frames.items()}
        bad = [f"seed {s}" for s in (3, 6) if s in each and each[s] >= 0]
        below = {s: (int((f["a_fin"] < 0).sum()), int(f["a_fin"].notna().sum())) for s, f in frames.items()}
        text = ", ".join(f"seed {s} {each[s]:+.3f}" + (f" ({below[s][0]} of {below[s][1]} updates below 0)"
                                                      if each[s] >= 0 else "") for s in replayed)
        iv = paired_difference(list(each.values()), [0.0] * len(each))  # over the replays
        out.append({"hypothesis": "H2a",
                    "measurement": f"{m_a}: pooled {pooled:+.3f}; over the {len(each)} replays "
                                   f"{_bounds(iv.mean, iv.low, iv.high)} ({text})",
                    "reading": "refuted" if pooled >= 0 or bad else "consistent",
                    "why": ("pooled ā_fin ≥ 0" if pooled >= 0 else f"ā_fin ≥ 0 in {' and '.join(bad)}"
                            if bad else "ā_fin < 0 pooled and in seeds 3 and 6 (the box names only what "
                                        "refutes)"),
                    "pooled": pooled, "low": iv.low, "high": iv.high,
                    **{f"seed {s}": v for s, v in each.items()},
                    **{f"seed {s} below": below[s][0] for s in replayed}})
        f = follows(frames, n_perm=n_perm, through=updates)
        rho, p = f["rho"], f["p"]
        reading = "refuted" if rho >= 0 else ("supported" if p < 0.05 else "undecided")
        out.append({"hypothesis": "H2b", "measurement": f"{m_b}: {rho:+.2f} (permutation p = {p:.3f})",
                    "reading": reading,
                    "why": {"refuted": "the mean correlation is ≥ 0",
                            "supported": "below 0 with p < 0.05",
                            "undecided": "below 0 but p ≥ 0.05"}[reading], "rho": rho, "p": p})
    m_c = "runs failing a cut measure, centred removal against standardised removal"
    missing = _missing(runs, ("removal-none", "removal-group"), seeds)
    if missing:
        out.append(_not_read("H2 contrast", m_c, missing))
    else:
        chosen = _on(runs, seeds)
        n = {sc: _cut_count(chosen, sc) for sc in ("none", "group")}
        out.append({"hypothesis": "H2 contrast",
                    "measurement": f"{m_c}: {n['none']} of {len(seeds)} against {n['group']} of {len(seeds)}",
                    "reading": "refuted" if n["none"] >= n["group"] else "consistent",
                    "why": "as many or more" if n["none"] >= n["group"] else
                    "fewer (the box names only what refutes)",
                    "centred": n["none"], "standardised": n["group"]})
    return out


def read_h3(runs: list[Run], seeds=ORACLE_SEEDS) -> list[dict]:
    """H3 per scaling, on the oracle's ``seeds``: the contribution loses if oracle - wta lies
    below 0; the estimate loses if oracle - removal lies above 0 and oracle - wta does not lie
    below 0; otherwise undecided. On seeds other than :data:`ORACLE_SEEDS` the rows are named
    ``H3 (<n> seeds) <scaling>``."""
    out = []
    tag = "H3" if tuple(seeds) == ORACLE_SEEDS else f"H3 ({len(tuple(seeds))} seeds)"
    for sc, name in (("group", "standardised"), ("none", "centred")):
        h = f"{tag} {name}"
        measurement = f"oracle against both signals, deployed, seeds {', '.join(map(str, seeds))}"
        missing = _missing(runs, (f"oracle-{sc}", f"wta-{sc}", f"removal-{sc}"), seeds)
        if missing:
            out.append(_not_read(h, measurement, missing))
            continue
        chosen = _on(runs, seeds)
        vw = seed_verdict(chosen, a="oracle", b="wta", scaling=sc).loc["deployed"]
        vr = seed_verdict(chosen, a="oracle", b="removal", scaling=sc).loc["deployed"]
        if vw["high"] < 0:
            reading, why = "the contribution loses", "oracle − wta lies below 0"
        elif vr["low"] > 0:
            reading, why = "the estimate loses", "oracle − removal lies above 0, oracle − wta not below 0"
        else:
            reading, why = "undecided", "neither interval excludes 0 on its side"
        out.append({"hypothesis": h, "reading": reading, "why": why,
                    "measurement": f"{measurement}: oracle − wta {_bounds(*vw[['mean', 'low', 'high']])}, "
                                   f"oracle − removal {_bounds(*vr[['mean', 'low', 'high']])}"})
    return out


def read_h4(runs: list[Run], seeds=SEEDS) -> dict:
    """H4: the share of centred removal runs with a dropped-out agent is below standardised
    removal's; refuted if it is as large or larger."""
    measurement = "removal runs with an agent below 10 % held-out accuracy, centred against "\
                  "standardised"
    missing = _missing(runs, ("removal-none", "removal-group"), seeds)
    if missing:
        return _not_read("H4", measurement, missing)
    chosen = _on(runs, seeds)
    n = len(seeds)
    share = {sc: _drop_count(chosen, sc) / n for sc in ("none", "group")}
    worse = share["none"] >= share["group"]
    return {"hypothesis": "H4", "reading": "refuted" if worse else "consistent",
            "measurement": f"{measurement}: {share['none'] * n:.0f} of {n} against "
                           f"{share['group'] * n:.0f} of {n}",
            "why": "as large or larger" if worse else "smaller (the box names only what refutes)",
            "centred": share["none"], "standardised": share["group"]}


def read_h5(runs: list[Run], replays: list[Run] = (), seeds=SEEDS, replayed=REPLAYED,
            updates: int = UPDATES) -> list[dict]:
    """H5, the rollout's scale: ``scale_rewards="batch"`` (centred in the group, divided by the
    agent's standard deviation over the whole rollout) against standardised, on ``seeds``.

    - H5a: D = (removal - wta) under batch minus (removal - wta) standardised, deployed, paired
      by seed: supported if its interval lies above 0, refuted if below, otherwise undecided;
    - H5b: batch removal fails a cut measure on fewer seeds than standardised removal; refuted
      if on as many or more;
    - H5c: fewer batch removal runs than standardised removal runs have a dropped-out agent;
      refuted if as many or more;
    - H5 check (of the manipulation, not a hypothesis): ``|a_fin|`` pooled over the first
      ``updates`` updates of the batch removal runs is below that of the standardised removal
      replays; if not, batch scaling did not shrink what H2 measures, and H5a to H5c say
      nothing about a group's own spread.
    """
    out = []
    missing = _missing(runs, ("wta-batch", "removal-batch", "wta-group", "removal-group"), seeds)
    m_a = "D = (removal − wta) batch − (removal − wta) standardised, deployed, paired by seed"
    m_b = "removal runs failing a cut measure, batch against standardised"
    m_c = "removal runs with an agent below 10 % held-out accuracy, batch against standardised"
    if missing:
        out += [_not_read(h, m, missing) for h, m in (("H5a", m_a), ("H5b", m_b), ("H5c", m_c))]
    else:
        chosen = _on(runs, seeds)
        diff = {sc: paired_seeds(chosen, "removal", "wta", sc, ("deployed",))["deployed", "difference"]
                .reindex(list(seeds)).to_numpy() for sc in ("batch", "group")}
        d = paired_difference(diff["batch"], diff["group"])
        low, high = d.mean - d.half_width, d.mean + d.half_width
        reading = "supported" if low > 0 else "refuted" if high < 0 else "undecided"
        out.append({"hypothesis": "H5a", "reading": reading,
                    "measurement": f"{m_a}: {_bounds(d.mean, low, high)} (removal − wta batch "
                                   f"{diff['batch'].mean():+.3f}, standardised {diff['group'].mean():+.3f})",
                    "why": {"supported": "the interval lies above 0", "refuted": "the interval lies below 0",
                            "undecided": "the interval contains 0"}[reading],
                    "mean": d.mean, "low": low, "high": high})
        n = len(seeds)
        for h, m, which in (("H5b", m_b, _cut_count), ("H5c", m_c, _drop_count)):
            c = {sc: which(chosen, sc) for sc in ("batch", "group")}
            worse = c["batch"] >= c["group"]
            out.append({"hypothesis": h, "reading": "refuted" if worse else "consistent",
                        "measurement": f"{m}: {c['batch']} of {n} against {c['group']} of {n}",
                        "why": "as many or more" if worse else "fewer (the box names only what refutes)",
                        "batch": c["batch"], "standardised": c["group"]})
    m_k = f"|ā_fin| over updates 1 to {updates}, batch removal runs against the standardised replays"
    have = {int(r.config.get("seed", 0)): r for r in replays if r.arm == "removal-group"}
    gone = [f"removal-group replay seed {s}" for s in replayed if s not in have]
    gone += _missing(runs, ("removal-batch",), seeds)
    if gone:
        out.append(_not_read("H5 check", m_k, gone))
    else:
        batch = {int(r.config["seed"]): finish_advantages(r).loc[:updates] for r in runs
                 if r.arm == "removal-batch" and int(r.config.get("seed", 0)) in seeds}
        group = {s: finish_advantages(have[s]).loc[:updates] for s in replayed}
        a_b, a_g = pooled_fin(batch), pooled_fin(group)
        took = abs(a_b) < abs(a_g)
        out.append({"hypothesis": "H5 check", "reading": "holds" if took else "fails",
                    "measurement": f"{m_k}: {a_b:+.3f} against {a_g:+.3f}",
                    "why": "smaller: batch scaling shrinks what H2 measures" if took else
                    "not smaller: H5a to H5c say nothing about a group's own spread",
                    "batch": a_b, "standardised": a_g})
    return out


def read_twin(runs: list[Run], predictions: dict, seeds=SEEDS) -> list[dict]:
    """The fourth box: chapter 7's twin against chapter 8's ten seeds.

    ``predictions`` is ``data/results/ch07/twin/predictions.json`` as a dict. For each scaling
    and each of removal and the oracle, the twin's mean difference against winner-take-all
    (deployed accuracy over its seeds) *agrees* with chapter 8 when chapter 8's paired interval
    over ``seeds`` contains it and *contradicts* it otherwise; a last row reads whether H3 at
    ten seeds refutes the twin (chapter 8's oracle − wta below 0 under either scaling)."""
    import numpy as np

    arms = {(a["scale_rewards"], a["signal"]): np.asarray(a["accuracy"], float) for a in predictions["arms"]}
    out, below = [], []
    for sc, name in (("group", "standardised"), ("none", "centred")):
        for sig in ("removal", "oracle"):
            h = f"twin {sig} − wta {name}"
            twin = float((arms[sc, sig] - arms[sc, "wta"]).mean())
            measurement = (f"the twin's {sig} − wta {twin:+.3f} against chapter 8's seeds "
                           f"{seeds[0]}-{seeds[-1]}")
            missing = _missing(runs, (f"{sig}-{sc}", f"wta-{sc}"), seeds)
            if missing:
                out.append({**_not_read(h, measurement, missing), "twin": twin})
                continue
            v = seed_verdict(_on(runs, seeds), a=sig, b="wta", scaling=sc).loc["deployed"]
            inside = v["low"] <= twin <= v["high"]
            if sig == "oracle":
                below.append(v["high"] < 0)
            out.append({"hypothesis": h, "reading": "agrees" if inside else "contradicts",
                        "why": "chapter 8's interval contains the twin's mean" if inside
                        else "chapter 8's interval excludes the twin's mean",
                        "measurement": f"{measurement}: {_bounds(*v[['mean', 'low', 'high']])}",
                        "twin": twin, "mean": v["mean"], "low": v["low"], "high": v["high"]})
    h = "twin on H3"
    if len(below) < 2:
        out.append({"hypothesis": h, "reading": "not read", "measurement": "chapter 8's oracle − wta",
                    "why": "the oracle's ten seeds are not all recorded under both scalings"})
    else:
        refuted = any(below)
        out.append({"hypothesis": h, "reading": "refuted" if refuted else "consistent",
                    "measurement": "chapter 8's oracle − wta at ten seeds, both scalings",
                    "why": "it lies below 0 under a scaling" if refuted
                    else "it lies below 0 under neither scaling (the box names only what refutes)"})
    return out


def read_hypotheses(runs: list[Run], replays: list[Run] = (), n_perm: int = 10_000,
                    predictions: dict | None = None) -> pd.DataFrame:
    """H1 to H4 read from ``runs`` (the grid of record, every scaling) and ``replays`` (the
    standardised replays), H3 also at ten seeds, the twin's predictions where ``predictions``
    is given, and H5's withdrawal; one row per reading: measurement, reading and the rule's why
    first, then each reading's numbers (``pooled``, ``rho``, ``p``, ``mean``, ...; NaN where a
    reading has none), so that a page reads them here rather than computing a reading twice."""
    rows = [read_h1(runs), *read_h2(runs, list(replays), n_perm=n_perm), *read_h3(runs), read_h4(runs),
            *read_h3(runs, SEEDS), *(read_twin(runs, predictions) if predictions else []),
            {"hypothesis": "H5", "measurement": "batch scaling, seeds 0 to 9", "reading": "withdrawn",
             "why": H5_WITHDRAWN}]
    table = pd.DataFrame(rows).set_index("hypothesis")
    first = ["measurement", "reading", "why"]
    return table[first + [c for c in table.columns if c not in first]]

