-- parlor's store on PostgreSQL, schema version 1 (bot/src/store/pg/mod.rs).
--
-- Real columns for what the store looks rows up by (session, ids, keys); the values are the
-- same versioned JSON the sled store keeps ({"v":1,...}), as text: kept byte for byte, so
-- a conditional write compares exactly what was read, and one decoder serves both stores.
-- Keys are COLLATE "C" so that their order is byte order, as in sled (prefix scans).

-- Ids of pending inputs and outbox rows: increasing, never reused, shared by both.
CREATE SEQUENCE parlor_ids AS bigint START 1;

-- The chat log of each session: seq is dense from 0 under `next` of its head row; the
-- unique message id is the inbound dedupe.
CREATE TABLE parlor_messages (
    session text COLLATE "C" NOT NULL,
    seq bigint NOT NULL,
    message_id text COLLATE "C" NOT NULL,
    value text NOT NULL,
    PRIMARY KEY (session, seq),
    UNIQUE (session, message_id)
);

-- One row per session with a log: the next seq. Locked by every write to the log, so two
-- writers of one chat take turns.
CREATE TABLE parlor_message_heads (
    session text COLLATE "C" PRIMARY KEY,
    next bigint NOT NULL
);

-- Session history, one row per message ({"v":2,...}, bot/src/store/history.rs).
CREATE TABLE parlor_history (
    session text COLLATE "C" NOT NULL,
    seq bigint NOT NULL,
    value text NOT NULL,
    PRIMARY KEY (session, seq)
);

-- One row per session with a history: the next seq; the history's lock.
CREATE TABLE parlor_history_heads (
    session text COLLATE "C" PRIMARY KEY,
    next bigint NOT NULL
);

CREATE TABLE parlor_summaries (
    session text COLLATE "C" PRIMARY KEY,
    value text NOT NULL
);

CREATE TABLE parlor_pending (
    id bigint PRIMARY KEY,
    session text COLLATE "C" NOT NULL,
    value text NOT NULL
);
CREATE INDEX parlor_pending_session ON parlor_pending (session);

-- Replies not yet sent.
CREATE TABLE parlor_outbox (
    id bigint PRIMARY KEY,
    session text COLLATE "C" NOT NULL,
    value text NOT NULL
);
CREATE INDEX parlor_outbox_session ON parlor_outbox (session);

-- Replies sent or given up on, kept for a while (pruned by done_at).
CREATE TABLE parlor_outbox_done (
    id bigint PRIMARY KEY,
    done_at timestamptz NOT NULL,
    value text NOT NULL
);
CREATE INDEX parlor_outbox_done_at ON parlor_outbox_done (done_at);

-- Small adapter state and the store's own markers (a session's migration).
CREATE TABLE parlor_meta (
    key text COLLATE "C" PRIMARY KEY,
    value text NOT NULL
);

-- The bot's place in each chat.
CREATE TABLE parlor_chats (
    session text COLLATE "C" PRIMARY KEY,
    value text NOT NULL
);

-- Toolset collections: any text, as the toolset wrote it.
CREATE TABLE parlor_kv (
    space text COLLATE "C" NOT NULL,
    key text COLLATE "C" NOT NULL,
    value text NOT NULL,
    PRIMARY KEY (space, key)
);
