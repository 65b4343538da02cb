"""`ppre tester serve`: run the Tester service (P1); `ppre tester validate-bisg`: check its
BISG against the Self-ID answers (paper appendix D; `tester_service.demographics.bisg_validation`)."""
from __future__ import annotations

import argparse
import contextlib
import os

from common.crypto import batch, paillier
from common.errors import InputError
from ppre.commands import (add_names_argument, add_service_arguments, add_tls_arguments, link_settings, listening_words,
                           tls_identity)
from tester_service.demographics.bisg import GEO_TABLES, GEOS


def register(sub: argparse._SubParsersAction) -> None:
    parser = sub.add_parser("tester", help="the Tester service (P1)")
    actions = parser.add_subparsers(dest="action", required=True)
    s = actions.add_parser("serve", help="serve RunAudit and drive audits against the Test-Client")
    s.add_argument("--host", default=os.environ.get("PPRE_TESTER_HOST", "127.0.0.1"), metavar="ADDRESS",
                   help="the address to listen on (env PPRE_TESTER_HOST; default 127.0.0.1: this machine only); "
                        "0.0.0.0 listens on every interface, for the operators on other machines "
                        "(docs/deployment.md)")
    s.add_argument("--port", type=int, default=int(os.environ.get("PPRE_TESTER_PORT", "50051")))
    s.add_argument("--client", default=os.environ.get("PPRE_CLIENT_ADDRESS", "127.0.0.1:50052"),
                   help="HOST:PORT of the Test-Client service (env PPRE_CLIENT_ADDRESS)")
    s.add_argument("--probabilities", default=os.environ.get("PPRE_TESTER_PROBABILITIES"),
                   help="prepared probability table, CSV or Parquet (env PPRE_TESTER_PROBABILITIES)")
    s.add_argument("--members", default=os.environ.get("PPRE_TESTER_MEMBERS"),
                   help="members file (member_id, surname, zip[, first_name, tract, state, country, opt_out]): "
                        "BISG + Self-ID + clipping run inside each audit (env PPRE_TESTER_MEMBERS)")
    add_preparation_arguments(s)
    add_release_arguments(s)
    s.add_argument("--buckets", type=int, default=int(os.environ.get("PPRE_BOOTSTRAP_BUCKETS", "128")))
    s.add_argument("--audit-log", default=os.environ.get("PPRE_AUDIT_LOG"),
                   help="append every audit request and its outcome to this keyed, chained log "
                        "(no member-level data; check it with `ppre log verify`) (env PPRE_AUDIT_LOG)")
    s.add_argument("--audit-log-key", default=os.environ.get("PPRE_AUDIT_LOG_KEY_FILE"), metavar="FILE",
                   help="the audit log's HMAC key, outside the log's directory; created (mode 0600) for a new "
                        "log (needed with --audit-log; env PPRE_AUDIT_LOG_KEY_FILE)")
    s.add_argument("--audit-log-head", default=os.environ.get("PPRE_AUDIT_LOG_HEAD"), metavar="FILE",
                   help="after each record write the log's head (count and last MAC) here, for `ppre log verify "
                        "--expect-head` (default: the key file's path + .head; env PPRE_AUDIT_LOG_HEAD)")
    s.add_argument("--history", default=os.environ.get("PPRE_TESTER_HISTORY"), metavar="FILE",
                   help="keep every finished audit's result (aggregates only) in this SQLite run history, "
                        "for `ppre runs list/show --tester` (env PPRE_TESTER_HISTORY; default: none)")
    add_service_arguments(s)
    add_tls_arguments(s, "tester")
    add_names_argument(s, "--allow-operator", "PPRE_ALLOW_OPERATORS", "operator.ppre.local",
                       "an operator identity (certificate SAN or CN) allowed to start audits")
    s.add_argument("--client-identity", default=os.environ.get("PPRE_CLIENT_IDENTITY", "client.ppre.local"),
                   metavar="NAME", help="the identity the Test-Client's certificate must carry, whatever address "
                                        "--client names (env PPRE_CLIENT_IDENTITY, default client.ppre.local)")
    from ppre.columns import add_column_arguments
    add_column_arguments(s, whose="the members and Self-ID files (or the probability table)")
    s.set_defaults(func=run)  # `ppre.cli` then adds --config FILE, `check-config`, `config-table` (ppre/config/)
    register_validate_bisg(actions)


def register_validate_bisg(actions: argparse._SubParsersAction) -> None:
    from tester_service.demographics import bisg_validation as bv
    env = os.environ.get
    v = actions.add_parser("validate-bisg", help="compare BISG variants with the Self-ID answers (paper appendix D)",
                           description="Cross-entropy and calibration of BISG (and, with --first-names, BIFSG "
                                       "and BISF) against the Self-ID answers. Runs on the Tester alone, sends "
                                       "nothing, writes nothing; prints aggregates only, small cells withheld.")
    v.add_argument("--members", required=True, metavar="FILE",
                   help="members file (member_id, surname, zip[, first_name, tract, state, country, opt_out])")
    v.add_argument("--self-id", dest="self_id", required=True, metavar="FILE",
                   help="Self-ID survey file (member_id, race)")
    v.add_argument("--first-names", action="store_true",
                   help="also BIFSG (surname + first name + geography) and BISF (surname + first name); "
                        "needs a first_name column")
    v.add_argument("--geo", choices=GEO_TABLES, default="zcta",
                   help="geography of BISG and BIFSG: ZCTA from zip (default) or tract GEOID from tract")
    v.add_argument("--json", action="store_true", help="print the report as one JSON object")
    v.add_argument("--bins", type=int, default=bv.DEFAULT_BINS, metavar="N",
                   help=f"equal-width calibration bins over [0, 1] (1 to {bv.MAX_BINS}, default {bv.DEFAULT_BINS})")
    v.add_argument("--min-bin-count", type=int, default=bv.DEFAULT_MIN_BIN_COUNT, metavar="N",
                   help=f"withhold group rows and bins with fewer members (at least 1, "
                        f"default {bv.DEFAULT_MIN_BIN_COUNT})")
    v.add_argument("--excluded-states", default=env("PPRE_EXCLUDED_STATES", ""),
                   help="comma-separated state codes whose members (and answers) are not used "
                        "(env PPRE_EXCLUDED_STATES, as `ppre tester serve`)")
    v.add_argument("--opt-out-column", default=env("PPRE_OPT_OUT_COLUMN", "opt_out"),
                   help="opted-out members (and their answers) are not used (env PPRE_OPT_OUT_COLUMN)")
    from ppre.columns import add_column_arguments
    add_column_arguments(v, env=False, whose="the members and Self-ID files")
    v.set_defaults(func=run_validate_bisg)


def run_validate_bisg(args: argparse.Namespace) -> int:
    """Print the validation report (text, or JSON with --json) to stdout."""
    import json

    from ppre.columns import tester_columns
    from tester_service.demographics.bisg_validation import format_report, validate
    states = tuple(x.strip() for x in args.excluded_states.split(",") if x.strip())
    report = validate(args.members, args.self_id, geo=args.geo, first_names=args.first_names, bins=args.bins,
                      min_bin_count=args.min_bin_count, excluded_states=states, opt_out_column=args.opt_out_column,
                      columns=tester_columns(args))  # one mapping for both files, as `ppre tester serve`
    print(json.dumps(report, indent=2, allow_nan=False) if args.json else format_report(report), flush=True)
    return 0


def add_preparation_arguments(s: argparse.ArgumentParser, prefix: str = "") -> None:
    """The Tester's demographic preparation options (design §2), shared with `ppre audit --local`."""
    env = os.environ.get
    s.add_argument(f"--{prefix}self-id", dest="self_id", default=env("PPRE_TESTER_SELF_ID"),
                   help="Self-ID survey file (member_id, race) (env PPRE_TESTER_SELF_ID)")
    s.add_argument("--epsilon", type=float, default=env("PPRE_EPSILON", "4.5"),
                   help="randomized-response epsilon for Self-ID (default 4.5)")
    s.add_argument("--threshold", type=float, default=env("PPRE_CLIP_THRESHOLD"),
                   help="clipping threshold T (default: the 90%%-of-largest-BISG-probabilities rule)")
    s.add_argument("--excluded-states", default=env("PPRE_EXCLUDED_STATES", ""),
                   help="comma-separated state codes whose members are not measured")
    s.add_argument("--geo", choices=GEOS, default=env("PPRE_GEO", "zcta"),
                   help="geography: zcta (from zip, default), tract (from tract) or none (surname only; "
                        "with --first-names: BISF) (env PPRE_GEO)")
    s.add_argument("--first-names", action="store_true", default=env("PPRE_FIRST_NAMES", "") == "1",
                   help="BIFSG: use the members' first names")
    s.add_argument("--group-mapping", default=env("PPRE_GROUP_MAPPING", ""),
                   help="coarsened groups, e.g. 'hsm=black+hispanic+aian,non_hsm=white+api+multiple'")
    s.add_argument("--opt-out-column", default=env("PPRE_OPT_OUT_COLUMN", "opt_out"))


def add_release_arguments(s: argparse.ArgumentParser, local: bool = False) -> None:
    """The Tester's release controls (design §8; `tester_service.release`), shared
    with `ppre audit --local`. The defaults are the secure ones."""
    from tester_service import release as r
    env = os.environ.get
    s.add_argument("--min-intersection", type=int, default=env("PPRE_MIN_INTERSECTION", str(r.DEFAULT_MIN_INTERSECTION)),
                   metavar="N", help=f"refuse audits whose intersection holds fewer distinct members "
                                     f"(default {r.DEFAULT_MIN_INTERSECTION})")
    s.add_argument("--min-effective-size", type=float,
                   default=env("PPRE_MIN_EFFECTIVE_SIZE", str(r.DEFAULT_MIN_EFFECTIVE_SIZE)), metavar="X",
                   help=f"suppress cells whose effective size (sum of p_ij over their rows) is below X "
                        f"(default {r.DEFAULT_MIN_EFFECTIVE_SIZE:g})")
    s.add_argument("--noise-rho", type=float, default=env("PPRE_NOISE_RHO", str(r.DEFAULT_RHO_PER_AUDIT)),
                   metavar="RHO", help=f"zCDP rho one audit spends on Gaussian noise added under encryption "
                                       f"(default {r.DEFAULT_RHO_PER_AUDIT:g}; 0: no noise)")
    s.add_argument("--privacy-budget", type=float, default=env("PPRE_PRIVACY_BUDGET", str(r.DEFAULT_BUDGET)),
                   metavar="RHO", help=f"total rho per Test-Client identity, across audits and dataset names "
                                       f"(default {r.DEFAULT_BUDGET:g}; 'inf': unlimited)")
    s.add_argument("--population-budget", type=float,
                   default=env("PPRE_POPULATION_BUDGET", str(r.DEFAULT_POPULATION_BUDGET)), metavar="RHO",
                   help=f"total rho all Test-Client identities together may spend on the Tester's members (one "
                        f"population per set of Tester input files), beside each identity's --privacy-budget "
                        f"(default {r.DEFAULT_POPULATION_BUDGET:g}; 'inf': unlimited; env PPRE_POPULATION_BUDGET)")
    s.add_argument("--max-population-refusals", type=int,
                   default=env("PPRE_MAX_POPULATION_REFUSALS", str(r.DEFAULT_MAX_POPULATION_REFUSALS)), metavar="N",
                   help=f"refuse every audit of the Tester's members once N audits of them, by any Test-Client "
                        f"identity{' or local client file' if local else ''}, were refused for their intersection "
                        f"(default {r.DEFAULT_MAX_POPULATION_REFUSALS}; each answers a noisy yes/no about "
                        f"membership: docs/threat-model.md; env PPRE_MAX_POPULATION_REFUSALS)")
    where = ("default: the user's data directory; one budget per pair of input files, keyed by a digest of their "
             "contents" if local else "needed with release noise on, unless --ephemeral-budget")
    s.add_argument("--privacy-ledger", default=env("PPRE_PRIVACY_LEDGER"), metavar="FILE",
                   help=f"keep the rho spent per Test-Client here ({where}; env PPRE_PRIVACY_LEDGER)")
    if not local:
        s.add_argument("--max-refusals", type=int, default=env("PPRE_MAX_REFUSALS", str(r.DEFAULT_MAX_REFUSALS)),
                       metavar="N", help=f"refuse every audit of a Test-Client identity once N of its audits were "
                                         f"refused for their intersection (default {r.DEFAULT_MAX_REFUSALS}; "
                                         f"counted in the --privacy-ledger; env PPRE_MAX_REFUSALS)")
        s.add_argument("--ephemeral-budget", action="store_true", default=env("PPRE_EPHEMERAL_BUDGET", "") == "1",
                       help="keep the privacy budget in memory only: a restart resets it and every Test-Client "
                            "may spend its budget again (for tests and demos; env PPRE_EPHEMERAL_BUDGET=1)")
    if local:
        s.add_argument("--privacy-identity", default=env("PPRE_PRIVACY_IDENTITY"), metavar="NAME",
                       help="charge every local audit to this one Test-Client identity instead of the pair of "
                            "input files, as a Tester charges a Test-Client's certificate identity whatever "
                            "it submits (to rehearse a production budget; env PPRE_PRIVACY_IDENTITY)")
    s.add_argument("--no-release-controls", action="store_true",
                   default=env("PPRE_NO_RELEASE_CONTROLS", "") == "1",
                   help="turn every release control off: exact results, no protection of the members "
                        "against a Test-Client that chooses its outputs (stated loudly in the output)")


#: printed on stderr whenever the release controls are off
RELEASE_OFF_WARNING = ("WARNING: --no-release-controls: results are released without noise, thresholds or "
                       "budget; a Test-Client that chooses its outputs can read members' race off them")


def release_settings(args: argparse.Namespace, local: bool = False):
    """(ReleasePolicy, PrivacyAccountant) from the release flags."""
    import sys

    from tester_service.release import PrivacyAccountant, ReleasePolicy, local_ledger_path, population_key
    if args.no_release_controls:
        print(RELEASE_OFF_WARNING, file=sys.stderr, flush=True)
        policy = ReleasePolicy.off()
        return policy, PrivacyAccountant(policy.budget)
    try:
        policy = ReleasePolicy(min_intersection=args.min_intersection, min_effective_size=args.min_effective_size,
                               rho=args.noise_rho, budget=args.privacy_budget,
                               **({} if local else {"max_refusals": args.max_refusals}))
    except InputError as exc:  # name the flag the user typed, not the policy's field
        flag = "--" + (exc.parameter or "").replace(" ", "-")
        raise InputError(str(exc).split(": ", 1)[-1], parameter=flag) from None
    if not local:
        require_ledger(args, policy)
    if not args.population_budget > 0:
        raise InputError(f"must be above 0, got {args.population_budget:g}", parameter="--population-budget")
    if args.max_population_refusals < 0:
        raise InputError(f"must be a whole number >= 0, got {args.max_population_refusals}",
                         parameter="--max-population-refusals")
    ledger = args.privacy_ledger or (local_ledger_path() if local else None)
    population = None if local else population_key(
        (args.probabilities, None) if args.probabilities else (args.members, args.self_id))
    return policy, PrivacyAccountant(policy.budget, ledger, identity="local Test-Client" if local else None,
                                     population=population, population_budget=args.population_budget,
                                     max_population_refusals=args.max_population_refusals)


#: why `ppre tester serve` with release noise refuses to start without a ledger
NO_LEDGER = ("with release noise on, the privacy budget must outlive a restart: give --privacy-ledger FILE "
             "(env PPRE_PRIVACY_LEDGER; docs/privacy-ledger.md), or --ephemeral-budget to keep it in memory "
             "only (a restart resets every Test-Client's budget)")

#: printed on stderr when a service with noise on keeps its budget in memory
EPHEMERAL_WARNING = ("WARNING: --ephemeral-budget: the privacy budget is kept in memory only; a restart resets "
                     "what every Test-Client has spent")


def require_ledger(args: argparse.Namespace, policy) -> None:
    """A service with noise on and a finite budget (an identity's or the population's)
    keeps the budgets in a ledger file, unless the operator said in so many words that a
    restart may reset them (docs/privacy-ledger.md)."""
    import math
    finite = math.isfinite(policy.budget) or math.isfinite(getattr(args, "population_budget", math.inf))
    if (policy.rho > 0 and finite and not args.privacy_ledger
            and not getattr(args, "ephemeral_budget", False)):
        raise InputError(NO_LEDGER, parameter="--privacy-ledger")
    if policy.rho > 0 and not args.privacy_ledger and getattr(args, "ephemeral_budget", False):
        import sys
        print(EPHEMERAL_WARNING, file=sys.stderr, flush=True)


def audit_log(args: argparse.Namespace):
    """The keyed audit log of `--audit-log` (tester_service.audit_log), checked before
    anything listens; None without --audit-log."""
    from tester_service.audit_log import AuditLog
    if not args.audit_log:
        return None
    if not args.audit_log_key:
        raise InputError("the audit log is keyed: give --audit-log-key FILE (env PPRE_AUDIT_LOG_KEY_FILE), a file "
                         "outside the log's directory; it is created (mode 0600) for a new log",
                         parameter="--audit-log-key")
    return AuditLog.keyed(args.audit_log, args.audit_log_key, args.audit_log_head)


def preparation_config(args: argparse.Namespace):
    from common.races import GroupMapping
    from tester_service.demographics.preparation import PreparationConfig

    states = tuple(x.strip() for x in args.excluded_states.split(",") if x.strip())
    mapping = GroupMapping.parse(args.group_mapping) if args.group_mapping else None
    return PreparationConfig(epsilon=args.epsilon, threshold=args.threshold, excluded_states=states, geo=args.geo,
                             first_names=args.first_names, group_mapping=mapping,
                             opt_out_column=args.opt_out_column)


def run(args: argparse.Namespace) -> int:
    from ppre.commands import serve_forever, setup_logging
    setup_logging(args, "tester")  # the process is protected already (`ppre.cli.main`, design §7)
    if bool(args.probabilities) == bool(args.members):
        raise InputError("give exactly one of --probabilities (a prepared table) and --members",
                         parameter="--probabilities/--members")
    from common.net.tls import parse_names
    from ppre.columns import tester_columns
    columns = tester_columns(args)  # --id-column, --column: how the files name PPRE's columns
    tls = tls_identity(args)
    release = release_settings(args)  # refused here without a ledger (noise on), before any file is made
    service = dict(n_buckets=args.buckets, settings=link_settings(args), max_sessions=args.max_sessions,
                   audit_log=audit_log(args), tls=tls,
                   allowed_operators=parse_names(args.allow_operator), client_name=args.client_identity)
    service["history"] = args.history or None  # opened (and its schema checked) before anything listens
    with removed_unless_serving(args.history):
        server, port, servicer, config, test_keys = _start(args, service, columns, release)
    security = (f"mutual TLS as {tls.identity}; operators allowed: {', '.join(config.allowed_operators)}; "
                f"Test-Client identity {config.client_name}" if tls is not None else "INSECURE plaintext")
    print(f"tester serving on {listening_words(args.host, port)}; Test-Client at {args.client}; {security}; "
          f"crypto backend {batch.backend()} ({batch.backend_reason()})"
          + (f"; {paillier.test_keys_label()}" if test_keys else ""), flush=True)
    return serve_forever(server, servicer, config.executor)


@contextlib.contextmanager
def removed_unless_serving(history: str | None):
    """A run history this start creates (`--history FILE`, opened before the port is bound:
    its schema is checked before anything listens) is removed again, with SQLite's journal
    files, when the Tester does not get to serve (a port already taken, a bad input file):
    a failed start leaves no empty history behind. An existing history is never touched."""
    from pathlib import Path
    paths = [Path(history + suffix) for suffix in ("", "-journal", "-wal", "-shm")] if history else []
    new = [p for p in paths if not os.path.lexists(p)]
    try:
        yield
    except BaseException:
        for path in new:
            with contextlib.suppress(OSError):
                path.unlink()
        raise


def _start(args: argparse.Namespace, service: dict, columns, release):
    """The Tester's configuration, its inputs checked, and its server bound (not yet
    serving): (server, port, servicer, config, whether the keys are test keys)."""
    from ppre.commands import make_executor, shut_down_unless_serving
    from tester_service.server import TesterConfig, serve
    service["executor"] = make_executor(args)
    with shut_down_unless_serving(service["executor"]):
        service["min_modulus_bits"], test_keys = paillier.process_key_size()
        service["release"], service["accountant"] = release
        if args.probabilities:
            mapping = preparation_config(args).group_mapping
            config = TesterConfig.from_probability_file(args.client, args.probabilities, mapping, columns=columns,
                                                        **service)
            config.load_probabilities()  # check the table now, not at the first audit
        else:
            config = TesterConfig.from_members(args.client, args.members, args.self_id, preparation_config(args),
                                               columns=columns, **service)
            config.load_probabilities()  # check the files and parameters now, not at the first audit
        server, port, servicer = serve(config, args.port, args.host)
    return server, port, servicer, config, test_keys
