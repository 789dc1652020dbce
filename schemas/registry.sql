-- registry.sql — the schema of a dspark node's model registry (SQLite).
--
-- Numbered migrations, applied in order by shared/src/registry.c (which
-- embeds this file at build time), each in its own transaction; afterwards
-- PRAGMA user_version = the number of the last one applied. Append a new
-- migration to change the schema; never edit one that has shipped.
-- Connections use journal_mode=WAL, synchronous=FULL, foreign_keys=ON and a
-- busy timeout; writers use BEGIN IMMEDIATE. Times are unix milliseconds.

-- migration 1: models, versions, files, rollout history
CREATE TABLE models (
    id         INTEGER PRIMARY KEY,
    name       TEXT    NOT NULL UNIQUE CHECK (length(name) BETWEEN 1 AND 64),
    created_ms INTEGER NOT NULL
);

CREATE TABLE versions (
    id         INTEGER PRIMARY KEY,
    model_id   INTEGER NOT NULL REFERENCES models(id) ON DELETE CASCADE,
    version    TEXT    NOT NULL CHECK (length(version) BETWEEN 5 AND 64),
    major      INTEGER NOT NULL CHECK (major >= 0),
    minor      INTEGER NOT NULL CHECK (minor >= 0),
    patch      INTEGER NOT NULL CHECK (patch >= 0),
    pre        TEXT    NOT NULL DEFAULT '',
    state      TEXT    NOT NULL CHECK (state IN ('downloading', 'verified', 'shadow', 'canary',
                                                 'active', 'retired', 'rolled_back', 'rejected')),
    precision  TEXT    NOT NULL,
    signer     TEXT    NOT NULL CHECK (length(signer) = 16),
    created_ms INTEGER NOT NULL,
    updated_ms INTEGER NOT NULL,
    UNIQUE (model_id, version)
);
-- At most one active version per model.
CREATE UNIQUE INDEX versions_one_active ON versions(model_id) WHERE state = 'active';

CREATE TABLE files (
    version_id  INTEGER PRIMARY KEY REFERENCES versions(id) ON DELETE CASCADE,
    size        INTEGER NOT NULL CHECK (size > 0),
    hash        BLOB    NOT NULL CHECK (length(hash) = 32),   -- BLAKE2b-256 of the model file
    cipher_size INTEGER NOT NULL CHECK (cipher_size > size),
    chunk_size  INTEGER NOT NULL CHECK (chunk_size > 0),
    chunk_count INTEGER NOT NULL CHECK (chunk_count > 0),
    path        TEXT                                          -- installed file; NULL until installed
);

CREATE TABLE history (
    id         INTEGER PRIMARY KEY,
    version_id INTEGER NOT NULL REFERENCES versions(id) ON DELETE CASCADE,
    from_state TEXT,                                          -- NULL on the first record
    to_state   TEXT    NOT NULL,
    reason     TEXT    NOT NULL,
    at_ms      INTEGER NOT NULL
);
CREATE INDEX history_version ON history(version_id, id);

-- migration 2: chunk progress for resumable downloads, per-version metrics snapshots
CREATE TABLE chunks (
    version_id INTEGER NOT NULL REFERENCES versions(id) ON DELETE CASCADE,
    idx        INTEGER NOT NULL CHECK (idx >= 0),
    PRIMARY KEY (version_id, idx)
) WITHOUT ROWID;

CREATE TABLE metrics (
    id         INTEGER PRIMARY KEY,
    version_id INTEGER NOT NULL REFERENCES versions(id) ON DELETE CASCADE,
    at_ms      INTEGER NOT NULL,
    window_s   REAL    NOT NULL CHECK (window_s >= 0),
    requests   INTEGER NOT NULL CHECK (requests >= 0),
    errors     INTEGER NOT NULL CHECK (errors >= 0),
    p50_ms     REAL,                                          -- NULL when unknown
    p99_ms     REAL,
    note       TEXT                                           -- JSON (e.g. shadow comparison)
);
CREATE INDEX metrics_version ON metrics(version_id, id);

-- migration 3: control log (every signed control message a node took or refused, and its
-- own automatic rollbacks) and the replay guard: seq must grow per signer key
CREATE TABLE control_log (
    id       INTEGER PRIMARY KEY,
    at_ms    INTEGER NOT NULL,
    signer   TEXT,                                            -- key id; "node" for automatic
    seq      INTEGER,                                         -- NULL when the body was unreadable
    target   TEXT,                                            -- topic level: node name or all
    cmd      TEXT,
    model    TEXT,
    version  TEXT,
    pct      INTEGER,
    accepted INTEGER NOT NULL CHECK (accepted IN (0, 1)),
    reason   TEXT    NOT NULL
);
CREATE INDEX control_log_signer ON control_log(signer, seq);

-- migration 4: manifests refused before any version could be trusted (bad signature, unknown
-- signer, a manifest on another model's topic): no version row may be made from them
CREATE TABLE refusals (
    id      INTEGER PRIMARY KEY,
    at_ms   INTEGER NOT NULL,
    model   TEXT    NOT NULL,                                 -- the topic's model name
    version TEXT,                                             -- NULL when the manifest could not be read
    reason  TEXT    NOT NULL
);
CREATE INDEX refusals_model ON refusals(model, id);
