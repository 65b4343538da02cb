"""``ppre tester check-config`` (docs/configuration.md): the Tester's settings and every
file they name (column mapping, preparation and release settings, the members and Self-ID
files or the prepared probability table, and the preparation itself, in memory), without
opening a port or contacting anyone.
"""
from __future__ import annotations

import argparse

from ppre.columns import tester_columns
from ppre.config.check import (Report, check_service_settings, check_tls, check_writable_parent, config_problems,
                               size_words)


def check_tester(args: argparse.Namespace) -> int:
    """`ppre tester check-config`."""
    import pyarrow as pa

    from tester_service.demographics.bisg import SOURCES
    from common.tables import check_member_ids, clean_member_ids
    from ppre.commands.tester import preparation_config
    from tester_service.demographics.preparation import (prepare, read_members, read_self_id, self_id_categories,
                                                         validate_members)
    from tester_service.inputs import read_probability_table
    from tester_service.release import PrivacyAccountant, ReleasePolicy

    report = Report("tester", args)
    config_problems(report)
    columns = report.run("column mapping", lambda: tester_columns(args),
                         lambda m: ", ".join(f"{a} <- '{b}'" for a, b in m.items()) or "none (the standard names)")
    prep = report.run("preparation settings", lambda: preparation_config(args),
                      lambda p: f"epsilon {p.epsilon:g}, "
                                f"T {'by the 90% rule' if p.threshold is None else p.threshold}, "
                                f"geography {p.geo}{', first names (BIFSG)' if p.first_names else ''}"
                                f"{', excluded states ' + ','.join(p.excluded_states) if p.excluded_states else ''}"
                                f"{', groups ' + ','.join(p.group_mapping.names) if p.group_mapping else ''}")

    def release():
        if args.no_release_controls:
            return "OFF (--no-release-controls): exact results, no noise, no thresholds, no budget"
        policy = ReleasePolicy(min_intersection=args.min_intersection, min_effective_size=args.min_effective_size,
                               rho=args.noise_rho, budget=args.privacy_budget)
        from ppre.commands.tester import require_ledger
        if not args.data_only:  # a service setting: noise on needs a ledger, or --ephemeral-budget said out loud
            require_ledger(args, policy)
        PrivacyAccountant(policy.budget, args.privacy_ledger)  # reads the ledger, if any; writes nothing
        ledger = f"ledger {args.privacy_ledger}" if args.privacy_ledger else "ledger in memory"
        return (f"min intersection {policy.min_intersection}, min effective size {policy.min_effective_size:g}, "
                f"rho {policy.rho:g} per audit, budget {policy.budget:g} ({ledger})")
    report.run("release controls", release, lambda text: text)
    if args.buckets < 1:
        report.fail("bootstrap buckets", f"--buckets must be at least 1, got {args.buckets}")
    if not args.data_only:
        check_service_settings(report, "--allow-operator", "operator")
        check_writable_parent(report, "audit log", args.audit_log, "appended to")
        check_writable_parent(report, "run history", getattr(args, "history", None), "SQLite run history")
        check_tls(report)

    if bool(args.probabilities) == bool(args.members):
        report.fail("inputs", "give exactly one of --probabilities (a prepared table) and --members")
    elif columns is None:
        report.fail("inputs", "not read: the column mapping is wrong (above)")
    elif args.probabilities:
        mapping = prep.group_mapping if prep is not None else None

        def describe(table):
            groups = [c for c in table.columns if c != "member_id"]
            return (f"{args.probabilities}: {len(table)} members, {size_words(args.probabilities)}; "
                    f"groups {', '.join(groups)}")
        report.run("probability table", lambda: read_probability_table(args.probabilities, mapping, columns),
                   describe)
    else:
        opt_out = prep.opt_out_column if prep is not None else args.opt_out_column

        def members():
            frame = read_members(args.members, opt_out, columns)
            validate_members(frame, str(args.members), opt_out)
            return frame
        member_frame = report.run("members file", members, lambda f: (
            f"{args.members}: {len(f)} members, {size_words(args.members)}; columns {', '.join(f.columns)}"))
        survey = None
        if args.self_id:
            def self_id():
                frame = read_self_id(args.self_id, columns)
                ids = clean_member_ids(pa.array(frame["member_id"].to_numpy(dtype=object)), str(args.self_id))
                check_member_ids(ids, str(args.self_id))
                self_id_categories(frame, str(args.self_id))
                return frame
            survey = report.run("Self-ID file", self_id, lambda f: (
                f"{args.self_id}: {len(f)} answers, {size_words(args.self_id)}"))
        if member_frame is not None and prep is not None and (survey is not None or not args.self_id):
            def preparation():
                out = prepare(member_frame, survey, prep, labels=(str(args.members), str(args.self_id)))
                return out.attrs["preparation"]

            def describe(st):
                kept = st.members_in - st.dropped_opt_out - st.dropped_non_us - st.dropped_excluded_state
                sources = ", ".join(f"{s} {st.sources.get(s, 0)} ({st.sources.get(s, 0) / max(kept, 1):.1%})"
                                    for s in SOURCES)
                return (f"{kept} of {st.members_in} members kept (dropped: {st.dropped_opt_out} opted out, "
                        f"{st.dropped_non_us} outside the US, {st.dropped_excluded_state} in excluded states); "
                        f"BISG sources: {sources}; Self-ID answers used {st.self_id_used}, of members not kept "
                        f"{st.self_id_dropped}, of people not in the members file {st.self_id_not_among_members} "
                        f"(dropped); T = {st.threshold:.4f}, {st.clipped_rows} rows clipped")
            stats = report.run("preparation (BISG, Self-ID, clipping; in memory)", preparation, describe)
            if stats is not None:
                report.checks[-1].details = {"members_in": stats.members_in, "bisg_sources": dict(stats.sources),
                                             "self_id_used": stats.self_id_used, "threshold": stats.threshold}
    return report.finish()

