"""Job history: one SQLite database, `<experiments root>/jobs.sqlite`, for every run.

Each row is one job: where it ran (local or slurm), its Slurm id, the plan, the
experiment directory, its state, exit code, elapsed time and, once finished, the
parsed results. `refresh` brings Slurm jobs up to date from, in order of authority:
squeue (a job still queued or running), sacct (when accounting is enabled), the
job-completion file (jobcomp/filetxt, kept by clusters without accounting),
`scontrol show job` (finished jobs Slurm still remembers) and last the job's own
exit.json written by its script. Which of them settled a job's state is kept in its
`state_source` column.
"""

from __future__ import annotations

import json
import re
import sqlite3
import subprocess
import time
from contextlib import contextmanager
from pathlib import Path

from ..files import open_regular
from ..rundir import ACTIVE, DB_FILE, EXIT_FILE, launcher_alive

SLURM_QUERY_TIMEOUT_S = 30

# The states trainbench reports; Slurm's many others map onto these (raw kept in slurm_state).
FINAL = ("COMPLETED", "FAILED", "CANCELLED", "TIMEOUT")
UNKNOWN = "UNKNOWN"

_SLURM_STATES = {
    "PENDING": "PENDING", "REQUEUED": "PENDING", "REQUEUE_HOLD": "PENDING",
    "REQUEUE_FED": "PENDING", "RESV_DEL_HOLD": "PENDING", "SUSPENDED": "PENDING",
    "CONFIGURING": "RUNNING", "RUNNING": "RUNNING", "COMPLETING": "RUNNING",
    "RESIZING": "RUNNING", "SIGNALING": "RUNNING", "STAGE_OUT": "RUNNING",
    "STOPPED": "RUNNING",
    "COMPLETED": "COMPLETED",
    "CANCELLED": "CANCELLED",
    "TIMEOUT": "TIMEOUT", "DEADLINE": "TIMEOUT",
    "FAILED": "FAILED", "NODE_FAIL": "FAILED", "BOOT_FAIL": "FAILED",
    "OUT_OF_MEMORY": "FAILED", "PREEMPTED": "FAILED", "SPECIAL_EXIT": "FAILED",
    "REVOKED": "CANCELLED",
}

COLUMNS = ("id", "executor", "job_id", "name", "exp_dir", "plan_json", "state", "slurm_state",
           "exit_code", "elapsed_s", "submitted", "updated", "results_json", "note",
           "state_source")
# Where a Slurm job's state last came from (the state_source column).
SOURCES = ("squeue", "sacct", "jobcomp", "scontrol", "exit.json")
_SCHEMA = """
CREATE TABLE IF NOT EXISTS jobs (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    executor TEXT NOT NULL,
    job_id TEXT,
    name TEXT NOT NULL,
    exp_dir TEXT NOT NULL,
    plan_json TEXT NOT NULL,
    state TEXT NOT NULL,
    slurm_state TEXT,
    exit_code INTEGER,
    elapsed_s REAL,
    submitted REAL NOT NULL,
    updated REAL NOT NULL,
    results_json TEXT,
    note TEXT,
    state_source TEXT
)
"""


# Writers (launchers of a bulk sweep, a refresh) hold the lock for milliseconds; a lock held
# longer belongs to something else (an open `sqlite3` shell, a hung process), and waiting
# for it longer only delays the message.
LOCK_TIMEOUT_S = 5.0


class JobsDBError(ValueError):
    """The job history cannot be used: not a database, damaged, locked by another process
    or impossible to create. The message is one line with the fix."""


def db_error(path: Path, err: BaseException) -> JobsDBError | None:
    """The JobsDBError an sqlite3 or OS error means for the history at path, or None for
    errors a caller handles itself (a full disk while updating a job)."""
    text = str(err)
    if isinstance(err, sqlite3.OperationalError) and "locked" in text:
        return JobsDBError(f"the job history {path} is locked by another process (waited "
                           f"{LOCK_TIMEOUT_S:g} s); let it finish or stop it (`fuser {path}` "
                           "names it), then retry")
    if isinstance(err, sqlite3.OperationalError) and "unable to open" in text:
        return JobsDBError(f"cannot open the job history {path}: {text}; check that it is a "
                           "file in a writable directory, or pass another --root")
    if isinstance(err, sqlite3.DatabaseError) and not isinstance(err, sqlite3.OperationalError):
        return JobsDBError(f"the job history {path} is damaged or not an SQLite database "
                           f"({text}); move it aside (mv {path} {path}.bad) and trainbench "
                           "starts a new one")
    if isinstance(err, OSError):
        return JobsDBError(f"cannot create the job history {path}: {err.strerror}; pass a "
                           "writable --root")
    return None


@contextmanager
def _translated(path: Path):
    """A locked or damaged history becomes JobsDBError; other errors pass unchanged."""
    try:
        yield
    except sqlite3.Error as err:
        raise (db_error(path, err) or err) from None


class JobsDB:
    """The job history under one experiments root."""

    def __init__(self, root: str | Path):
        self.path = Path(root) / DB_FILE
        try:
            if self.path.is_dir():
                raise sqlite3.OperationalError("unable to open database file: it is a directory")
            self.path.parent.mkdir(parents=True, exist_ok=True)
            with self._connect() as conn:
                conn.execute(_SCHEMA)
                # A history written before state_source existed gains the column, empty.
                present = {row["name"] for row in conn.execute("PRAGMA table_info(jobs)")}
                if "state_source" not in present:
                    try:
                        conn.execute("ALTER TABLE jobs ADD COLUMN state_source TEXT")
                    except sqlite3.OperationalError as err:  # another process added it first
                        if "duplicate column" not in str(err):
                            raise
                # A damaged file can open and still fail on the first page it reads.
                conn.execute("SELECT id FROM jobs ORDER BY id DESC LIMIT 1").fetchall()
        except (sqlite3.Error, OSError) as err:
            raise (db_error(self.path, err) or err) from None

    @staticmethod
    def check(root: str | Path) -> None:
        """JobsDBError when an existing history under root is unusable; creates nothing."""
        if (Path(root) / DB_FILE).exists():
            JobsDB(root)

    def _connect(self) -> sqlite3.Connection:
        # Several launchers (a bulk sweep, a refresh) may write at once; wait, don't fail.
        conn = sqlite3.connect(self.path, timeout=LOCK_TIMEOUT_S)
        conn.row_factory = sqlite3.Row
        return conn

    def add(self, executor: str, job_id: str | None, name: str, exp_dir: str, plan_json: str,
            state: str) -> int:
        """Record a new job; its row id."""
        now = time.time()
        with _translated(self.path), self._connect() as conn:
            cur = conn.execute(
                "INSERT INTO jobs (executor, job_id, name, exp_dir, plan_json, state, submitted,"
                " updated) VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
                (executor, job_id, name, str(exp_dir), plan_json, state, now, now))
            return int(cur.lastrowid)

    def update(self, id: int, **fields) -> None:
        """Set columns of one job (results may be given as a dict: `results=...`)."""
        if "results" in fields:
            results = fields.pop("results")
            fields["results_json"] = None if results is None else json.dumps(results)
        unknown = set(fields) - set(COLUMNS[1:])
        if unknown:
            raise ValueError(f"unknown job fields: {', '.join(sorted(unknown))}")
        if not fields:
            return
        fields["updated"] = time.time()
        names = list(fields)
        with _translated(self.path), self._connect() as conn:
            cur = conn.execute(
                f"UPDATE jobs SET {', '.join(f'{n} = ?' for n in names)} WHERE id = ?",
                [fields[n] for n in names] + [id])
            if cur.rowcount == 0:
                raise KeyError(id)

    def list(self) -> list[dict]:
        """Every job, oldest first."""
        with _translated(self.path), self._connect() as conn:
            return [dict(row) for row in conn.execute("SELECT * FROM jobs ORDER BY id")]

    def get(self, id: int) -> dict | None:
        with _translated(self.path), self._connect() as conn:
            row = conn.execute("SELECT * FROM jobs WHERE id = ?", (id,)).fetchone()
        return dict(row) if row else None

    def find(self, job_id: str, executor: str = "slurm") -> dict | None:
        """The newest job with this scheduler id."""
        with _translated(self.path), self._connect() as conn:
            row = conn.execute("SELECT * FROM jobs WHERE job_id = ? AND executor = ? "
                               "ORDER BY id DESC LIMIT 1", (job_id, executor)).fetchone()
        return dict(row) if row else None


# --- what Slurm knows about a job ------------------------------------------------------------

def _run(cmd: list[str]) -> subprocess.CompletedProcess | None:
    try:
        return subprocess.run(cmd, capture_output=True, text=True, timeout=SLURM_QUERY_TIMEOUT_S)
    except (FileNotFoundError, subprocess.TimeoutExpired):
        return None


def normalise_state(raw: str) -> str:
    """'CANCELLED by 0' -> CANCELLED; Slurm's rarer states onto trainbench's six."""
    word = raw.split()[0].rstrip("+") if raw.strip() else ""
    return _SLURM_STATES.get(word, UNKNOWN)


def parse_exit_code(text: str) -> int | None:
    """Slurm's 'code:signal' -> the shell's view: code, or 128 + signal when killed."""
    m = re.fullmatch(r"\s*(\d+):(\d+)\s*", text or "")
    if not m:
        return None
    code, sig = int(m.group(1)), int(m.group(2))
    return 128 + sig if sig and not code else code


def parse_elapsed(text: str) -> float | None:
    """'[D-]HH:MM:SS' or 'MM:SS' -> seconds."""
    m = re.fullmatch(r"\s*(?:(\d+)-)?(?:(\d+):)?(\d+):(\d+)(?:\.\d+)?\s*", text or "")
    if not m:
        return None
    days, hours, minutes, seconds = (int(g) if g else 0 for g in m.groups())
    return float(((days * 24 + hours) * 60 + minutes) * 60 + seconds)


class SlurmUnreachable(Exception):
    """squeue is missing or cannot reach slurmctld: states cannot be refreshed here."""


def squeue_state(job_id: str) -> str | None:
    """The raw state while Slurm still lists the job, else None.

    SlurmUnreachable when squeue is missing or fails for another reason than a job id
    Slurm has already forgotten.
    """
    proc = _run(["squeue", "-h", f"--jobs={job_id}", "-o", "%T"])
    if proc is None:
        raise SlurmUnreachable("squeue is not available on this machine")
    if proc.returncode != 0:
        if "invalid job id" in proc.stderr.lower():
            return None
        raise SlurmUnreachable(" ".join(proc.stderr.split()) or "squeue failed")
    lines = proc.stdout.split()
    return lines[0] if lines else None


def sacct_record(job_id: str) -> dict | None:
    """State, exit code and elapsed from accounting; None where accounting is disabled."""
    proc = _run(["sacct", "-n", "-P", "-X", f"--jobs={job_id}",
                 "-o", "JobID,State,ExitCode,Elapsed"])
    if proc is None or proc.returncode != 0:
        return None
    for line in proc.stdout.splitlines():
        parts = line.split("|")
        if len(parts) == 4 and parts[0] == job_id:
            return {"slurm_state": parts[1], "exit_code": parse_exit_code(parts[2]),
                    "elapsed_s": parse_elapsed(parts[3])}
    return None


def _key_values(line: str) -> dict[str, str]:
    """KEY=VALUE words of a Slurm record. The first occurrence wins: the state fields come
    before WorkDir and Command, whose paths may contain spaces and `JobState=`."""
    fields: dict[str, str] = {}
    # (?<!\w): a key starts at a word's start, so a long word without `=` is passed once.
    for m in re.finditer(r"(?<!\w)(\w+)=(\S*)", line):
        fields.setdefault(m.group(1), m.group(2))
    return fields


def _slurm_time(text: str) -> float | None:
    try:
        return time.mktime(time.strptime(text, "%Y-%m-%dT%H:%M:%S"))
    except (ValueError, TypeError):
        return None


def _record_from_fields(fields: dict[str, str]) -> dict:
    start, end = _slurm_time(fields.get("StartTime", "")), _slurm_time(fields.get("EndTime", ""))
    return {"slurm_state": fields.get("JobState", ""),
            "exit_code": parse_exit_code(fields.get("ExitCode", "")),
            "elapsed_s": end - start if start is not None and end is not None else None}


def jobcomp_location() -> Path | None:
    """The jobcomp/filetxt file, when the cluster keeps one."""
    proc = _run(["scontrol", "show", "config"])
    if proc is None or proc.returncode != 0:
        return None
    conf = {}
    for line in proc.stdout.splitlines():
        key, sep, value = line.partition("=")
        if sep:
            conf[key.strip()] = value.strip()
    if conf.get("JobCompType", "").lower() != "jobcomp/filetxt":
        return None
    loc = conf.get("JobCompLoc", "")
    return Path(loc) if loc.startswith("/") else None


def jobcomp_record(job_id: str, path: Path | None) -> dict | None:
    """The job's line in the job-completion file (the newest, if requeued)."""
    if path is None:
        return None
    prefix = f"JobId={job_id} ".encode()
    found = None
    try:  # streamed: a cluster's completion file grows to gigabytes
        with open_regular(path) as fh:
            for line in fh:
                if line.startswith(prefix):
                    found = line
    except OSError:
        return None
    return _record_from_fields(_key_values(found.decode("utf-8", "replace"))) if found else None


def scontrol_record(job_id: str) -> dict | None:
    """A finished job Slurm still remembers (for MinJobAge after its end)."""
    proc = _run(["scontrol", "show", "job", "-o", job_id])
    if proc is None or proc.returncode != 0 or not proc.stdout.strip():
        return None
    fields = _key_values(proc.stdout)
    return _record_from_fields(fields) if fields.get("JobId") == job_id else None


def exit_record(exp_dir: str | Path) -> dict | None:
    """The job's own exit.json (written by its script, or by the local launcher)."""
    try:
        data = json.loads((Path(exp_dir) / EXIT_FILE).read_text())
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) and isinstance(data.get("exit_code"), int) else None


def slurm_status(job_id: str, exp_dir: str, jobcomp: Path | None) -> dict:
    """The freshest facts about one Slurm job: state, slurm_state, exit_code, elapsed_s,
    and state_source, the one of SOURCES that settled the state.

    Where Slurm cannot be asked (no squeue here, slurmctld down), only the job's own
    exit.json can settle it; otherwise the state is left as it was, with a note.
    """
    try:
        raw = squeue_state(job_id)
    except SlurmUnreachable as err:
        own = exit_record(exp_dir)
        if own is not None:
            return {"state": "COMPLETED" if own["exit_code"] == 0 else "FAILED",
                    "exit_code": own["exit_code"], "elapsed_s": own.get("elapsed_s"),
                    "state_source": "exit.json"}
        return {"note": f"state not refreshed: {err}"}
    if raw and normalise_state(raw) in ACTIVE:
        return {"state": normalise_state(raw), "slurm_state": raw, "state_source": "squeue"}
    # A final state from the first source that has one. Accounting may lag the end of a
    # job by a moment (still RUNNING there while squeue has let it go): then the next
    # source answers instead.
    for name, source in (("sacct", lambda: sacct_record(job_id)),
                         ("jobcomp", lambda: jobcomp_record(job_id, jobcomp)),
                         ("scontrol", lambda: scontrol_record(job_id))):
        record = source()
        if record and normalise_state(record["slurm_state"]) in FINAL:
            record["state"] = normalise_state(record["slurm_state"])
            record["state_source"] = name
            if record["exit_code"] is None or record["elapsed_s"] is None:
                own = exit_record(exp_dir) or {}
                if record["exit_code"] is None:
                    record["exit_code"] = own.get("exit_code")
                if record["elapsed_s"] is None:
                    record["elapsed_s"] = own.get("elapsed_s")
            return record
    own = exit_record(exp_dir)
    if own is not None:
        return {"state": "COMPLETED" if own["exit_code"] == 0 else "FAILED",
                "slurm_state": None, "exit_code": own["exit_code"],
                "elapsed_s": own.get("elapsed_s"), "state_source": "exit.json"}
    if raw:
        return {"state": normalise_state(raw), "slurm_state": raw, "state_source": "squeue"}
    return {"state": UNKNOWN, "slurm_state": None, "state_source": None,
            "note": "Slurm no longer lists this job and it left no exit record"}


# --- results -----------------------------------------------------------------------------------

def parse_results(exp_dir: str | Path) -> tuple[dict | None, str | None]:
    """(results, note) for a finished experiment through trainbench.results.

    The results package is imported only here; where it (or its summarize_experiment)
    is missing, the job keeps its state and the note says why results are absent.
    """
    try:
        from ..results import summarize_experiment
    except ImportError:
        return None, "results not parsed: trainbench.results.summarize_experiment is unavailable"
    try:
        summary = summarize_experiment(Path(exp_dir))
    except Exception as err:  # noqa: BLE001 - a bad log must not stop a refresh of the rest
        first = str(err).splitlines()[0] if str(err) else type(err).__name__
        return None, f"results not parsed: {first}"
    if summary is None:
        return None, "results not parsed: no step records in the logs"
    data = summary.to_dict() if hasattr(summary, "to_dict") else summary
    return (data if isinstance(data, dict) else {"summary": data}), None


def settle_local_jobs(db: JobsDB) -> None:
    """Settle local jobs whose launcher died (SIGKILL, a crashed machine) without writing
    their end: `jobs list` and `jobs show` call this, so no manual refresh is needed."""
    stale = [job["id"] for job in db.list() if job["executor"] != "slurm"
             and job["state"] not in FINAL and not launcher_alive(job["job_id"], job["exp_dir"])]
    if stale:
        refresh(db, stale)


def refresh(db: JobsDB, ids: list[int] | None = None) -> list[dict]:
    """Bring jobs up to date: Slurm states, exit codes, elapsed and results.

    Jobs already final with results are left alone; the refreshed rows are returned.
    """
    jobcomp = None
    jobcomp_checked = False
    out = []
    for job in db.list():
        if ids is not None and job["id"] not in ids:
            continue
        if job["state"] in FINAL and job["results_json"] is not None:
            continue
        fields: dict = {}
        if job["executor"] == "slurm" and job["state"] not in FINAL and job["job_id"]:
            if not jobcomp_checked:
                jobcomp, jobcomp_checked = jobcomp_location(), True
            status = slurm_status(job["job_id"], job["exp_dir"], jobcomp)
            fields.update({k: v for k, v in status.items() if v is not None or k == "note"})
        elif job["executor"] != "slurm" and (job["state"] not in FINAL
                                             or job["elapsed_s"] is None):
            # Local runs are recorded by their launcher; exit.json completes the record
            # (and settles a run whose launcher died before it could).
            own = exit_record(job["exp_dir"])
            if own is not None:
                fields.update(state="COMPLETED" if own["exit_code"] == 0 else "FAILED",
                              exit_code=own["exit_code"], elapsed_s=own.get("elapsed_s"))
            elif job["state"] not in FINAL and not launcher_alive(job["job_id"], job["exp_dir"]):
                fields.update(state="FAILED", note=f"launcher killed: the local launcher (pid "
                              f"{job['job_id']}) ended without an exit record")
        state = fields.get("state", job["state"])
        if state in FINAL and job["results_json"] is None:
            results, note = parse_results(job["exp_dir"])
            fields["results"] = results
            if note:
                fields["note"] = note
            elif "note" not in fields:
                fields["note"] = None
        if fields:
            try:
                db.update(job["id"], **fields)
            except sqlite3.OperationalError as err:
                # A full disk (or a read-only history) must not hide the fresh state.
                if "full" not in str(err) and "readonly" not in str(err):
                    raise
                shown = {**job, **fields, "note": f"not saved in the job history: {err}"}
                shown.pop("results", None)
                out.append(shown)
                continue
        out.append(db.get(job["id"]))
    return out
