"""Names written once: bundle file and directory names, the two sides, document schema ids."""

from __future__ import annotations

# A bundle's files (README, "What a bundle holds").
RECEIPT = "receipt.json"
MANIFEST = "manifest.json"
SUMS = "SHA256SUMS"
README = "README.md"
RAW_DIR, LOGS_DIR, PROBES_DIR = "raw", "logs", "probes"

# A two-sided experiment: the pin before the fix and the pin with it.
SIDES = ("base", "head")
# The reserved expectation of a case whose code path is absent on a side (compare/5 on): its value
# is the list of symbols the probe names as missing there.
NOT_PRESENT = "not_present"

# Default caps on reading a bundle (evidence.safetree.Limits), here so that the CLI states
# them in --help without importing the bundle reader.
MAX_BUNDLE_FILES = 10_000
MAX_BUNDLE_FILE_BYTES = 512 << 20
MAX_BUNDLE_BYTES = 2 << 30

# Schema ids every kvprobe JSON document names (kvprobe.schema maps them to schemas/).
EXPERIMENT_SCHEMA = "kvprobe.experiment/1"
RECEIPT_SCHEMA = "kvprobe.receipt/1"
GATES_RECEIPT_SCHEMA = "kvprobe.gates-receipt/4"
# /3 bundles (gate 2 the only behavioural gate, its basis `gate2`) still verify by their own schema
GATES_RECEIPT_SCHEMA_3 = "kvprobe.gates-receipt/3"
# /2 bundles (no --env inputs, no gate4 basis) still verify by their own schema
GATES_RECEIPT_SCHEMA_2 = "kvprobe.gates-receipt/2"
# /1 bundles (inputs by path, later by name under the same id) still verify by their own schema
GATES_RECEIPT_SCHEMA_1 = "kvprobe.gates-receipt/1"
SWEEP_RECEIPT_SCHEMA = "kvprobe.sweep-receipt/2"
MANIFEST_SCHEMA = "kvprobe.manifest/1"
PROBE_OUTPUT_SCHEMA = "kvprobe.probe-output/1"
TEST_RUN_SCHEMA = "kvprobe.test-run/1"
PYTEST_REPORT_SCHEMA = "kvprobe.pytest-report/1"
# kvprobe's own data file of fix markers (kvprobe/gates/fixmarkers.toml), not a bundle document.
FIX_MARKERS_SCHEMA = "kvprobe.fix-markers/1"
# The fork server's reply lines (probe_api/kvprobe_forkserver.py): a message per $defs entry.
FORKSERVER_REPLY_SCHEMA = "kvprobe.forkserver-reply/1"

# The in-toto statement `kvprobe report --format intoto` writes, and `verify --attestation` reads.
INTOTO_PAYLOAD_TYPE = "application/vnd.in-toto+json"
INTOTO_PREDICATE_TYPE = "https://kvprobe.dev/attestation/receipt/v1"
