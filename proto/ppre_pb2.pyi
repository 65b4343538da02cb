from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class Table(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    TABLE_UNSPECIFIED: _ClassVar[Table]
    TESTER_ROWS: _ClassVar[Table]
    SHUFFLED_ROWS: _ClassVar[Table]
    CLIENT_ROWS: _ClassVar[Table]
    AGGREGATES: _ClassVar[Table]
    SQUARE_REQUEST: _ClassVar[Table]
    SQUARES: _ClassVar[Table]
    MEMBER_POINTS: _ClassVar[Table]
    MEMBER_VECTORS: _ClassVar[Table]
    BLIND_TOTALS: _ClassVar[Table]
TABLE_UNSPECIFIED: Table
TESTER_ROWS: Table
SHUFFLED_ROWS: Table
CLIENT_ROWS: Table
AGGREGATES: Table
SQUARE_REQUEST: Table
SQUARES: Table
MEMBER_POINTS: Table
MEMBER_VECTORS: Table
BLIND_TOTALS: Table

class ListRunsRequest(_message.Message):
    __slots__ = ("metric", "dataset", "since", "until", "limit")
    METRIC_FIELD_NUMBER: _ClassVar[int]
    DATASET_FIELD_NUMBER: _ClassVar[int]
    SINCE_FIELD_NUMBER: _ClassVar[int]
    UNTIL_FIELD_NUMBER: _ClassVar[int]
    LIMIT_FIELD_NUMBER: _ClassVar[int]
    metric: str
    dataset: str
    since: str
    until: str
    limit: int
    def __init__(self, metric: _Optional[str] = ..., dataset: _Optional[str] = ..., since: _Optional[str] = ..., until: _Optional[str] = ..., limit: _Optional[int] = ...) -> None: ...

class RunSummary(_message.Message):
    __slots__ = ("run_id", "started_at", "finished_at", "operator", "client", "metric", "metric_option", "dataset", "parameters_json", "n_matched", "severity", "verdict_message")
    RUN_ID_FIELD_NUMBER: _ClassVar[int]
    STARTED_AT_FIELD_NUMBER: _ClassVar[int]
    FINISHED_AT_FIELD_NUMBER: _ClassVar[int]
    OPERATOR_FIELD_NUMBER: _ClassVar[int]
    CLIENT_FIELD_NUMBER: _ClassVar[int]
    METRIC_FIELD_NUMBER: _ClassVar[int]
    METRIC_OPTION_FIELD_NUMBER: _ClassVar[int]
    DATASET_FIELD_NUMBER: _ClassVar[int]
    PARAMETERS_JSON_FIELD_NUMBER: _ClassVar[int]
    N_MATCHED_FIELD_NUMBER: _ClassVar[int]
    SEVERITY_FIELD_NUMBER: _ClassVar[int]
    VERDICT_MESSAGE_FIELD_NUMBER: _ClassVar[int]
    run_id: str
    started_at: str
    finished_at: str
    operator: str
    client: str
    metric: str
    metric_option: str
    dataset: str
    parameters_json: str
    n_matched: int
    severity: str
    verdict_message: str
    def __init__(self, run_id: _Optional[str] = ..., started_at: _Optional[str] = ..., finished_at: _Optional[str] = ..., operator: _Optional[str] = ..., client: _Optional[str] = ..., metric: _Optional[str] = ..., metric_option: _Optional[str] = ..., dataset: _Optional[str] = ..., parameters_json: _Optional[str] = ..., n_matched: _Optional[int] = ..., severity: _Optional[str] = ..., verdict_message: _Optional[str] = ...) -> None: ...

class ListRunsReply(_message.Message):
    __slots__ = ("runs",)
    RUNS_FIELD_NUMBER: _ClassVar[int]
    runs: _containers.RepeatedCompositeFieldContainer[RunSummary]
    def __init__(self, runs: _Optional[_Iterable[_Union[RunSummary, _Mapping]]] = ...) -> None: ...

class GetRunRequest(_message.Message):
    __slots__ = ("run_id",)
    RUN_ID_FIELD_NUMBER: _ClassVar[int]
    run_id: str
    def __init__(self, run_id: _Optional[str] = ...) -> None: ...

class RunRecord(_message.Message):
    __slots__ = ("summary", "report_json", "result_sha256")
    SUMMARY_FIELD_NUMBER: _ClassVar[int]
    REPORT_JSON_FIELD_NUMBER: _ClassVar[int]
    RESULT_SHA256_FIELD_NUMBER: _ClassVar[int]
    summary: RunSummary
    report_json: str
    result_sha256: str
    def __init__(self, summary: _Optional[_Union[RunSummary, _Mapping]] = ..., report_json: _Optional[str] = ..., result_sha256: _Optional[str] = ...) -> None: ...

class AuditRequest(_message.Message):
    __slots__ = ("metric", "client_dataset", "bootstrap", "confidence", "has_seed", "seed", "result_recipient", "metric_option", "tau", "metric_params", "correction")
    class MetricParamsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    METRIC_FIELD_NUMBER: _ClassVar[int]
    CLIENT_DATASET_FIELD_NUMBER: _ClassVar[int]
    BOOTSTRAP_FIELD_NUMBER: _ClassVar[int]
    CONFIDENCE_FIELD_NUMBER: _ClassVar[int]
    HAS_SEED_FIELD_NUMBER: _ClassVar[int]
    SEED_FIELD_NUMBER: _ClassVar[int]
    RESULT_RECIPIENT_FIELD_NUMBER: _ClassVar[int]
    METRIC_OPTION_FIELD_NUMBER: _ClassVar[int]
    TAU_FIELD_NUMBER: _ClassVar[int]
    METRIC_PARAMS_FIELD_NUMBER: _ClassVar[int]
    CORRECTION_FIELD_NUMBER: _ClassVar[int]
    metric: str
    client_dataset: str
    bootstrap: int
    confidence: float
    has_seed: bool
    seed: int
    result_recipient: str
    metric_option: str
    tau: float
    metric_params: _containers.ScalarMap[str, str]
    correction: str
    def __init__(self, metric: _Optional[str] = ..., client_dataset: _Optional[str] = ..., bootstrap: _Optional[int] = ..., confidence: _Optional[float] = ..., has_seed: _Optional[bool] = ..., seed: _Optional[int] = ..., result_recipient: _Optional[str] = ..., metric_option: _Optional[str] = ..., tau: _Optional[float] = ..., metric_params: _Optional[_Mapping[str, str]] = ..., correction: _Optional[str] = ...) -> None: ...

class AuditEvent(_message.Message):
    __slots__ = ("progress", "result", "error")
    PROGRESS_FIELD_NUMBER: _ClassVar[int]
    RESULT_FIELD_NUMBER: _ClassVar[int]
    ERROR_FIELD_NUMBER: _ClassVar[int]
    progress: Progress
    result: AuditResult
    error: AuditError
    def __init__(self, progress: _Optional[_Union[Progress, _Mapping]] = ..., result: _Optional[_Union[AuditResult, _Mapping]] = ..., error: _Optional[_Union[AuditError, _Mapping]] = ...) -> None: ...

class Progress(_message.Message):
    __slots__ = ("phase", "message", "elapsed_s", "done", "total", "audit_id")
    PHASE_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    ELAPSED_S_FIELD_NUMBER: _ClassVar[int]
    DONE_FIELD_NUMBER: _ClassVar[int]
    TOTAL_FIELD_NUMBER: _ClassVar[int]
    AUDIT_ID_FIELD_NUMBER: _ClassVar[int]
    phase: str
    message: str
    elapsed_s: float
    done: int
    total: int
    audit_id: str
    def __init__(self, phase: _Optional[str] = ..., message: _Optional[str] = ..., elapsed_s: _Optional[float] = ..., done: _Optional[int] = ..., total: _Optional[int] = ..., audit_id: _Optional[str] = ...) -> None: ...

class AuditResult(_message.Message):
    __slots__ = ("report_json", "run_id")
    REPORT_JSON_FIELD_NUMBER: _ClassVar[int]
    RUN_ID_FIELD_NUMBER: _ClassVar[int]
    report_json: str
    run_id: str
    def __init__(self, report_json: _Optional[str] = ..., run_id: _Optional[str] = ...) -> None: ...

class AuditError(_message.Message):
    __slots__ = ("code", "message")
    CODE_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    code: str
    message: str
    def __init__(self, code: _Optional[str] = ..., message: _Optional[str] = ...) -> None: ...

class Hello(_message.Message):
    __slots__ = ("protocol_version", "metric", "client_dataset", "metric_option", "salt_share", "probability_bits", "result_recipient", "sealed_width", "metric_params", "buckets", "correction", "audit_id", "value_bounds", "second_moments", "release_noise", "tester_paillier_n", "tester_paillier_h")
    class MetricParamsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    class ValueBoundsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: float
        def __init__(self, key: _Optional[str] = ..., value: _Optional[float] = ...) -> None: ...
    PROTOCOL_VERSION_FIELD_NUMBER: _ClassVar[int]
    METRIC_FIELD_NUMBER: _ClassVar[int]
    CLIENT_DATASET_FIELD_NUMBER: _ClassVar[int]
    METRIC_OPTION_FIELD_NUMBER: _ClassVar[int]
    SALT_SHARE_FIELD_NUMBER: _ClassVar[int]
    PROBABILITY_BITS_FIELD_NUMBER: _ClassVar[int]
    RESULT_RECIPIENT_FIELD_NUMBER: _ClassVar[int]
    SEALED_WIDTH_FIELD_NUMBER: _ClassVar[int]
    METRIC_PARAMS_FIELD_NUMBER: _ClassVar[int]
    BUCKETS_FIELD_NUMBER: _ClassVar[int]
    CORRECTION_FIELD_NUMBER: _ClassVar[int]
    AUDIT_ID_FIELD_NUMBER: _ClassVar[int]
    VALUE_BOUNDS_FIELD_NUMBER: _ClassVar[int]
    SECOND_MOMENTS_FIELD_NUMBER: _ClassVar[int]
    RELEASE_NOISE_FIELD_NUMBER: _ClassVar[int]
    TESTER_PAILLIER_N_FIELD_NUMBER: _ClassVar[int]
    TESTER_PAILLIER_H_FIELD_NUMBER: _ClassVar[int]
    protocol_version: int
    metric: str
    client_dataset: str
    metric_option: str
    salt_share: bytes
    probability_bits: int
    result_recipient: str
    sealed_width: int
    metric_params: _containers.ScalarMap[str, str]
    buckets: int
    correction: str
    audit_id: str
    value_bounds: _containers.ScalarMap[str, float]
    second_moments: bool
    release_noise: bool
    tester_paillier_n: bytes
    tester_paillier_h: bytes
    def __init__(self, protocol_version: _Optional[int] = ..., metric: _Optional[str] = ..., client_dataset: _Optional[str] = ..., metric_option: _Optional[str] = ..., salt_share: _Optional[bytes] = ..., probability_bits: _Optional[int] = ..., result_recipient: _Optional[str] = ..., sealed_width: _Optional[int] = ..., metric_params: _Optional[_Mapping[str, str]] = ..., buckets: _Optional[int] = ..., correction: _Optional[str] = ..., audit_id: _Optional[str] = ..., value_bounds: _Optional[_Mapping[str, float]] = ..., second_moments: _Optional[bool] = ..., release_noise: _Optional[bool] = ..., tester_paillier_n: _Optional[bytes] = ..., tester_paillier_h: _Optional[bytes] = ...) -> None: ...

class HelloAck(_message.Message):
    __slots__ = ("salt_share", "paillier_n", "paillier_h", "slot_bits", "rows", "strata_labels", "info_json", "slots", "value_bounds")
    class ValueBoundsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: float
        def __init__(self, key: _Optional[str] = ..., value: _Optional[float] = ...) -> None: ...
    SALT_SHARE_FIELD_NUMBER: _ClassVar[int]
    PAILLIER_N_FIELD_NUMBER: _ClassVar[int]
    PAILLIER_H_FIELD_NUMBER: _ClassVar[int]
    SLOT_BITS_FIELD_NUMBER: _ClassVar[int]
    ROWS_FIELD_NUMBER: _ClassVar[int]
    STRATA_LABELS_FIELD_NUMBER: _ClassVar[int]
    INFO_JSON_FIELD_NUMBER: _ClassVar[int]
    SLOTS_FIELD_NUMBER: _ClassVar[int]
    VALUE_BOUNDS_FIELD_NUMBER: _ClassVar[int]
    salt_share: bytes
    paillier_n: bytes
    paillier_h: bytes
    slot_bits: int
    rows: int
    strata_labels: _containers.RepeatedScalarFieldContainer[str]
    info_json: str
    slots: int
    value_bounds: _containers.ScalarMap[str, float]
    def __init__(self, salt_share: _Optional[bytes] = ..., paillier_n: _Optional[bytes] = ..., paillier_h: _Optional[bytes] = ..., slot_bits: _Optional[int] = ..., rows: _Optional[int] = ..., strata_labels: _Optional[_Iterable[str]] = ..., info_json: _Optional[str] = ..., slots: _Optional[int] = ..., value_bounds: _Optional[_Mapping[str, float]] = ...) -> None: ...

class TableChunk(_message.Message):
    __slots__ = ("table", "rows", "points", "sealed", "ciphertexts", "units", "strata", "tester_ciphertexts")
    TABLE_FIELD_NUMBER: _ClassVar[int]
    ROWS_FIELD_NUMBER: _ClassVar[int]
    POINTS_FIELD_NUMBER: _ClassVar[int]
    SEALED_FIELD_NUMBER: _ClassVar[int]
    CIPHERTEXTS_FIELD_NUMBER: _ClassVar[int]
    UNITS_FIELD_NUMBER: _ClassVar[int]
    STRATA_FIELD_NUMBER: _ClassVar[int]
    TESTER_CIPHERTEXTS_FIELD_NUMBER: _ClassVar[int]
    table: Table
    rows: int
    points: bytes
    sealed: bytes
    ciphertexts: bytes
    units: bytes
    strata: bytes
    tester_ciphertexts: bytes
    def __init__(self, table: _Optional[_Union[Table, str]] = ..., rows: _Optional[int] = ..., points: _Optional[bytes] = ..., sealed: _Optional[bytes] = ..., ciphertexts: _Optional[bytes] = ..., units: _Optional[bytes] = ..., strata: _Optional[bytes] = ..., tester_ciphertexts: _Optional[bytes] = ...) -> None: ...

class TableEnd(_message.Message):
    __slots__ = ("table", "rows")
    TABLE_FIELD_NUMBER: _ClassVar[int]
    ROWS_FIELD_NUMBER: _ClassVar[int]
    table: Table
    rows: int
    def __init__(self, table: _Optional[_Union[Table, str]] = ..., rows: _Optional[int] = ...) -> None: ...

class AggregatesHeader(_message.Message):
    __slots__ = ("groups", "replicates", "confidence", "slot_bits", "mask", "items", "item_slots", "tau", "small_groups", "suppressed_items", "interval", "plain_rows", "noise_sd", "zero_tests", "unidentifiable", "min_effective_size", "joined_members", "joined_members_sd")
    GROUPS_FIELD_NUMBER: _ClassVar[int]
    REPLICATES_FIELD_NUMBER: _ClassVar[int]
    CONFIDENCE_FIELD_NUMBER: _ClassVar[int]
    SLOT_BITS_FIELD_NUMBER: _ClassVar[int]
    MASK_FIELD_NUMBER: _ClassVar[int]
    ITEMS_FIELD_NUMBER: _ClassVar[int]
    ITEM_SLOTS_FIELD_NUMBER: _ClassVar[int]
    TAU_FIELD_NUMBER: _ClassVar[int]
    SMALL_GROUPS_FIELD_NUMBER: _ClassVar[int]
    SUPPRESSED_ITEMS_FIELD_NUMBER: _ClassVar[int]
    INTERVAL_FIELD_NUMBER: _ClassVar[int]
    PLAIN_ROWS_FIELD_NUMBER: _ClassVar[int]
    NOISE_SD_FIELD_NUMBER: _ClassVar[int]
    ZERO_TESTS_FIELD_NUMBER: _ClassVar[int]
    UNIDENTIFIABLE_FIELD_NUMBER: _ClassVar[int]
    MIN_EFFECTIVE_SIZE_FIELD_NUMBER: _ClassVar[int]
    JOINED_MEMBERS_FIELD_NUMBER: _ClassVar[int]
    JOINED_MEMBERS_SD_FIELD_NUMBER: _ClassVar[int]
    groups: _containers.RepeatedScalarFieldContainer[str]
    replicates: int
    confidence: float
    slot_bits: int
    mask: str
    items: int
    item_slots: int
    tau: float
    small_groups: _containers.RepeatedScalarFieldContainer[str]
    suppressed_items: _containers.RepeatedScalarFieldContainer[int]
    interval: str
    plain_rows: int
    noise_sd: _containers.RepeatedScalarFieldContainer[float]
    zero_tests: int
    unidentifiable: _containers.RepeatedScalarFieldContainer[str]
    min_effective_size: float
    joined_members: int
    joined_members_sd: float
    def __init__(self, groups: _Optional[_Iterable[str]] = ..., replicates: _Optional[int] = ..., confidence: _Optional[float] = ..., slot_bits: _Optional[int] = ..., mask: _Optional[str] = ..., items: _Optional[int] = ..., item_slots: _Optional[int] = ..., tau: _Optional[float] = ..., small_groups: _Optional[_Iterable[str]] = ..., suppressed_items: _Optional[_Iterable[int]] = ..., interval: _Optional[str] = ..., plain_rows: _Optional[int] = ..., noise_sd: _Optional[_Iterable[float]] = ..., zero_tests: _Optional[int] = ..., unidentifiable: _Optional[_Iterable[str]] = ..., min_effective_size: _Optional[float] = ..., joined_members: _Optional[int] = ..., joined_members_sd: _Optional[float] = ...) -> None: ...

class ClientResult(_message.Message):
    __slots__ = ("phase_seconds", "report_json")
    class PhaseSecondsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: float
        def __init__(self, key: _Optional[str] = ..., value: _Optional[float] = ...) -> None: ...
    PHASE_SECONDS_FIELD_NUMBER: _ClassVar[int]
    REPORT_JSON_FIELD_NUMBER: _ClassVar[int]
    phase_seconds: _containers.ScalarMap[str, float]
    report_json: str
    def __init__(self, phase_seconds: _Optional[_Mapping[str, float]] = ..., report_json: _Optional[str] = ...) -> None: ...

class MaskedPlaintexts(_message.Message):
    __slots__ = ("values", "width", "last", "phase_seconds")
    class PhaseSecondsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: float
        def __init__(self, key: _Optional[str] = ..., value: _Optional[float] = ...) -> None: ...
    VALUES_FIELD_NUMBER: _ClassVar[int]
    WIDTH_FIELD_NUMBER: _ClassVar[int]
    LAST_FIELD_NUMBER: _ClassVar[int]
    PHASE_SECONDS_FIELD_NUMBER: _ClassVar[int]
    values: bytes
    width: int
    last: bool
    phase_seconds: _containers.ScalarMap[str, float]
    def __init__(self, values: _Optional[bytes] = ..., width: _Optional[int] = ..., last: _Optional[bool] = ..., phase_seconds: _Optional[_Mapping[str, float]] = ...) -> None: ...

class Heartbeat(_message.Message):
    __slots__ = ("phase", "done", "total")
    PHASE_FIELD_NUMBER: _ClassVar[int]
    DONE_FIELD_NUMBER: _ClassVar[int]
    TOTAL_FIELD_NUMBER: _ClassVar[int]
    phase: str
    done: int
    total: int
    def __init__(self, phase: _Optional[str] = ..., done: _Optional[int] = ..., total: _Optional[int] = ...) -> None: ...

class Abort(_message.Message):
    __slots__ = ("code", "message")
    CODE_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    code: str
    message: str
    def __init__(self, code: _Optional[str] = ..., message: _Optional[str] = ...) -> None: ...

class PeerMessage(_message.Message):
    __slots__ = ("hello", "hello_ack", "chunk", "table_end", "aggregates_header", "client_result", "masked_plaintexts", "abort", "heartbeat")
    HELLO_FIELD_NUMBER: _ClassVar[int]
    HELLO_ACK_FIELD_NUMBER: _ClassVar[int]
    CHUNK_FIELD_NUMBER: _ClassVar[int]
    TABLE_END_FIELD_NUMBER: _ClassVar[int]
    AGGREGATES_HEADER_FIELD_NUMBER: _ClassVar[int]
    CLIENT_RESULT_FIELD_NUMBER: _ClassVar[int]
    MASKED_PLAINTEXTS_FIELD_NUMBER: _ClassVar[int]
    ABORT_FIELD_NUMBER: _ClassVar[int]
    HEARTBEAT_FIELD_NUMBER: _ClassVar[int]
    hello: Hello
    hello_ack: HelloAck
    chunk: TableChunk
    table_end: TableEnd
    aggregates_header: AggregatesHeader
    client_result: ClientResult
    masked_plaintexts: MaskedPlaintexts
    abort: Abort
    heartbeat: Heartbeat
    def __init__(self, hello: _Optional[_Union[Hello, _Mapping]] = ..., hello_ack: _Optional[_Union[HelloAck, _Mapping]] = ..., chunk: _Optional[_Union[TableChunk, _Mapping]] = ..., table_end: _Optional[_Union[TableEnd, _Mapping]] = ..., aggregates_header: _Optional[_Union[AggregatesHeader, _Mapping]] = ..., client_result: _Optional[_Union[ClientResult, _Mapping]] = ..., masked_plaintexts: _Optional[_Union[MaskedPlaintexts, _Mapping]] = ..., abort: _Optional[_Union[Abort, _Mapping]] = ..., heartbeat: _Optional[_Union[Heartbeat, _Mapping]] = ...) -> None: ...
