//! The shared backend: PostgreSQL through the synchronous `postgres` client (its own
//! runtime: call it off any async runtime, e.g. from `spawn_blocking`). Wake-ups:
//! `NOTIFY gatewrap_approvals, '<id>'` after the commit (see `wake::listen_pg`).
//! The connection is plain TCP or a unix socket (NoTls): TLS to the server is not built.
//! Sources: <https://www.postgresql.org/docs/current/sql-notify.html>,
//! <https://www.postgresql.org/docs/current/explicit-locking.html#ADVISORY-LOCKS>.

use bytes::BytesMut;
use postgres::types::{to_sql_checked, IsNull, ToSql, Type};
use postgres::{Client, NoTls, Row};

use super::sql::{schema, version_mismatch, SCHEMA_VERSION};
use super::{Db, Val};

/// The channel of the wake-ups.
pub const CHANNEL: &str = "gatewrap_approvals";

/// Key of the advisory lock taken while the schema is created (two gatewraps opening a
/// new database at once would otherwise race in CREATE TABLE IF NOT EXISTS).
const SCHEMA_LOCK: i64 = 0x6761_7465_7772_6170; // "gatewrap"

/// Key of the advisory lock an ask takes to count pending approvals and insert one
/// (`Store::check_caps`): "gatewrap" + 1.
const ASK_LOCK: i64 = SCHEMA_LOCK + 1;

impl ToSql for Val {
    fn to_sql(&self, ty: &Type, out: &mut BytesMut) -> Result<IsNull, Box<dyn std::error::Error + Sync + Send>> {
        match self {
            Val::Null => Ok(IsNull::Yes),
            Val::Int(v) if *ty == Type::INT4 => i32::try_from(*v)?.to_sql(ty, out),
            Val::Int(v) => v.to_sql(ty, out),
            Val::Real(v) => v.to_sql(ty, out),
            Val::Text(s) => s.to_sql(ty, out),
            Val::Blob(b) => b.to_sql(ty, out),
        }
    }

    fn accepts(_ty: &Type) -> bool {
        true
    }

    to_sql_checked!();
}

/// `?N` placeholders (SQLite's numbered form) as `$N`.
fn numbered(sql: &str) -> String {
    let mut out = String::with_capacity(sql.len());
    let mut chars = sql.chars().peekable();
    while let Some(c) = chars.next() {
        if c == '?' && chars.peek().is_some_and(|d| d.is_ascii_digit()) {
            out.push('$');
        } else {
            out.push(c);
        }
    }
    out
}

fn val_at(row: &Row, i: usize) -> Result<Val, postgres::Error> {
    let ty = row.columns()[i].type_();
    Ok(if *ty == Type::INT8 {
        row.try_get::<_, Option<i64>>(i)?.map_or(Val::Null, Val::Int)
    } else if *ty == Type::INT4 {
        row.try_get::<_, Option<i32>>(i)?.map_or(Val::Null, |v| Val::Int(v.into()))
    } else if *ty == Type::FLOAT8 {
        row.try_get::<_, Option<f64>>(i)?.map_or(Val::Null, Val::Real)
    } else if *ty == Type::BYTEA {
        row.try_get::<_, Option<Vec<u8>>>(i)?.map_or(Val::Null, Val::Blob)
    } else {
        row.try_get::<_, Option<String>>(i)?.map_or(Val::Null, Val::Text)
    })
}

pub struct Pg {
    client: Client,
}

impl Pg {
    /// Connect to `url` (a libpq-style URL) and create the schema if needed.
    pub fn open(url: &str) -> Result<Pg, String> {
        let mut client = Client::connect(url, NoTls).map_err(|e| e.to_string())?;
        let ddl = schema("DOUBLE PRECISION", "BIGINT", "BYTEA");
        client
            .batch_execute(&format!("BEGIN; SELECT pg_advisory_xact_lock({SCHEMA_LOCK}); {ddl} COMMIT;"))
            .map_err(|e| e.to_string())?;
        let found: String = client
            .query_one("SELECT value FROM meta WHERE key = 'schema'", &[])
            .and_then(|r| r.try_get(0))
            .map_err(|e| e.to_string())?;
        if found != SCHEMA_VERSION {
            return Err(version_mismatch(&found));
        }
        Ok(Pg { client })
    }
}

fn refs(params: &[Val]) -> Vec<&(dyn ToSql + Sync)> {
    params.iter().map(|p| p as &(dyn ToSql + Sync)).collect()
}

impl Db for Pg {
    fn exec(&mut self, sql: &str, params: &[Val]) -> Result<u64, String> {
        if params.is_empty() {
            return self.client.batch_execute(sql).map(|_| 0).map_err(|e| e.to_string());
        }
        self.client.execute(numbered(sql).as_str(), &refs(params)).map_err(|e| e.to_string())
    }

    fn query(&mut self, sql: &str, params: &[Val]) -> Result<Vec<Vec<Val>>, String> {
        let rows = self.client.query(numbered(sql).as_str(), &refs(params)).map_err(|e| e.to_string())?;
        rows.iter()
            .map(|r| (0..r.len()).map(|i| val_at(r, i)).collect::<Result<Vec<_>, _>>())
            .collect::<Result<Vec<_>, _>>()
            .map_err(|e| e.to_string())
    }

    fn begin(&mut self) -> Result<(), String> {
        self.client.batch_execute("BEGIN").map_err(|e| e.to_string())
    }

    fn lock_asks(&mut self) -> Result<(), String> {
        self.client.batch_execute(&format!("SELECT pg_advisory_xact_lock({ASK_LOCK})")).map_err(|e| e.to_string())
    }

    fn wake(&mut self, _run_wake: Option<&str>, id: &str) {
        let _ = self.client.execute("SELECT pg_notify($1, $2)", &[&CHANNEL, &id]);
    }
}
