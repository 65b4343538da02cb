"""``ppre synth``: write a synthetic, Census-grounded population (see `ppre.synth`).

Files written under ``--out DIR``:

* ``members.csv``  – ``member_id, surname, zip, first_name`` (the Tester's members;
  ``first_name`` is what ``--first-names`` BIFSG uses);
* ``self_id.csv``  – ``member_id, race`` (a ``--self-id-share`` subset, default 6%);
* ``truth.csv``    – ``member_id, race``: the hidden (final) true race, for evaluation only;
* ``client/ero.csv`` – ``member_id, y_true, y_pred`` (the Test-Client's data) with an
  injected false-positive-rate disparity (``--base-fpr``, ``--disparity``);
* one Test-Client dataset per other metric, drawn from the same members, each with the
  ``--disparity`` races disadvantaged (``ppre.synth``, "Test-Client data for the other
  metrics"): ``client/lot.csv`` (``query_id, member_id, rank, relevance``),
  ``client/mqos_ndcg.csv`` (the same columns, member_id the viewer),
  ``client/pot.csv`` (``member_id, score, outcome``), ``client/mqos_auc.csv``
  (``member_id, y_true, score``), ``client/output.csv`` (``member_id, outcome``) and
  ``client/prob_count.csv`` (``member_id, pool``).

``--mode generative`` (default) draws the true race first and the names and ZCTA given
it; ``--mode calibrated`` then redraws each member's true race from the BISG posterior
of their surname and ZCTA (``--calibrated-first-names``: the BIFSG posterior, for a
Tester run with ``--first-names``), so the probabilities the Tester computes are
calibrated by construction; Self-ID, the truth and every Test-Client table follow the
redrawn race. The command ends by printing the clipping threshold T the Tester's
default 90% rule derives from this population (``ppre.synth``, "Modes").
"""
from __future__ import annotations

import argparse
from pathlib import Path

import pyarrow as pa

from common.errors import InputError
from ppre.commands.bisg import write_table_atomic
from ppre.synth import MODES, SynthConfig, metric_datasets, parse_race_values, rule_threshold, synthesize


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser("synth", help="write a synthetic population and Test-Client data",
                              description=__doc__.splitlines()[0])
    p.add_argument("--members", type=int, required=True, help="number of members")
    p.add_argument("--seed", type=int, default=0, help="random seed (default 0)")
    p.add_argument("--out", required=True, help="output folder (created if missing)")
    p.add_argument("--self-id-share", type=float, default=0.06, help="share of members in Self-ID (default 0.06)")
    p.add_argument("--self-id-bias", default="",
                   help="relative Self-ID response propensity by race, e.g. 'white=1.5,black=0.7'")
    p.add_argument("--base-fpr", type=float, default=0.10, help="false-positive rate of every race (default 0.10)")
    p.add_argument("--disparity", default="black=0.08",
                   help="FPR added per race, e.g. 'black=0.08,hispanic=0.03' or 'none' (default black=0.08); "
                        "the same races are disadvantaged in the other metrics' datasets")
    p.add_argument("--positive-rate", type=float, default=0.30, help="share of y_true = 1 (default 0.30)")
    p.add_argument("--tpr", type=float, default=0.80, help="true-positive rate (default 0.80)")
    p.add_argument("--mode", default="generative",
                   help=f"how the true race is drawn: {' or '.join(MODES)} (redrawn from each member's "
                        "BISG posterior, so BISG is calibrated by construction); default generative")
    p.add_argument("--calibrated-first-names", action="store_true",
                   help="with --mode calibrated: redraw from the BIFSG posterior (surname, ZCTA and first "
                        "name), for a Tester run with --first-names")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    cfg = SynthConfig(members=args.members, seed=args.seed, self_id_share=args.self_id_share,
                      self_id_bias=parse_race_values(args.self_id_bias, "self-id-bias"),
                      base_fpr=args.base_fpr, disparity=parse_race_values(args.disparity, "disparity"),
                      positive_rate=args.positive_rate, tpr=args.tpr, mode=args.mode,
                      calibrated_first_names=args.calibrated_first_names)
    data = synthesize(cfg)
    out = Path(args.out)
    try:
        (out / "client").mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise InputError(f"cannot be created ({exc.strerror})", file=str(out)) from None
    tables = [("members.csv", data.members), ("self_id.csv", data.self_id),
              ("truth.csv", data.truth), ("client/ero.csv", data.ero)]
    tables += [(f"client/{name}.csv", df) for name, df in metric_datasets(cfg, data).items()]
    for name, df in tables:
        write_table_atomic(pa.Table.from_pandas(df, preserve_index=False), out / name)
    print(f"wrote {len(data.members)} members, {len(data.self_id)} Self-ID rows to {out} "
          f"(Test-Client datasets in {out / 'client'}: {', '.join(n[7:-4] for n, _ in tables[3:])})")
    posterior = "BIFSG (--first-names)" if cfg.calibrated_first_names else "BISG"
    print(f"{posterior} on this population: the 90% rule gives T = "
          f"{rule_threshold(data.members, first_names=cfg.calibrated_first_names):.3f}")
    return 0
