//! The PostgreSQL side of [`super::Connection`]: one `postgres::Client`
//! per database thread, the statement text rewritten from the shared
//! dialect, values and errors carried as rusqlite's.

use std::collections::HashMap;
use std::error::Error as StdError;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use bytes::BytesMut;
use postgres::types::{FromSql, IsNull, ToSql as PgToSql, Type as PgType};
use postgres::{Client, NoTls};
use rusqlite::ffi;
use rusqlite::types::{Type, Value};

use super::{Error, Result};

/// An open PostgreSQL session with its prepared statements.
pub struct PgConn {
    client: Client,
    url: String,
    schema: String,
    cache: HashMap<String, postgres::Statement>,
    /// Open transaction levels (0: autocommit).
    pub(crate) depth: u32,
    /// The advisory lock this session must hold ([`PgConn::try_fence`]).
    fence: Option<Fence>,
}

/// An advisory lock a session holds and takes again whenever it reopens.
#[derive(Clone)]
struct Fence {
    key: i64,
    lost: Arc<AtomicBool>,
}

/// The message of the error a fenced session answers with once another
/// session took its advisory lock.
pub const FENCED: &str = "store fenced: another registry holds this store's lock";

impl PgConn {
    /// Connects to `url` (`postgres://user@host:port/db`) and makes
    /// `schema` (created when missing) the one every unqualified name
    /// resolves to. The server's notices (`relation … already exists,
    /// skipping` at each start) are not sent; warnings are.
    ///
    /// Errors: the server cannot be reached or refuses the login, or the
    /// schema cannot be created.
    pub fn connect(url: &str, schema: &str) -> Result<Self> {
        let mut client = Client::connect(url, NoTls).map_err(to_error)?;
        let quoted = quote_ident(schema);
        client
            .batch_execute(&format!(
                "SET client_min_messages TO warning; \
                 CREATE SCHEMA IF NOT EXISTS {quoted}; SET search_path TO {quoted}"
            ))
            .map_err(to_error)?;
        Ok(Self {
            client,
            url: url.to_owned(),
            schema: schema.to_owned(),
            cache: HashMap::new(),
            depth: 0,
            fence: None,
        })
    }

    /// Take the session-level advisory lock `key` without waiting
    /// (`pg_try_advisory_lock`). Once taken, the session keeps it; when the
    /// session reopens (its connection ended, and the server let the lock
    /// go with it) it takes the lock again before any statement, and if
    /// another session has it meanwhile every statement fails with
    /// [`FENCED`] and the returned flag turns true: a registry that lost
    /// its store's lock never writes to it again.
    ///
    /// Returns `Ok(None)` while another session holds the lock.
    ///
    /// Errors: the server cannot be reached.
    pub fn try_fence(&mut self, key: i64) -> Result<Option<Arc<AtomicBool>>> {
        self.reconnect_if_closed()?;
        if !try_lock(&mut self.client, key)? {
            return Ok(None);
        }
        let lost = Arc::new(AtomicBool::new(false));
        self.fence = Some(Fence {
            key,
            lost: lost.clone(),
        });
        Ok(Some(lost))
    }

    /// Let go of the advisory lock of [`PgConn::try_fence`]; every later
    /// statement on this session fails with [`FENCED`] (a stopped
    /// registry writes no more). Does nothing without a fence.
    ///
    /// Errors: the server cannot be reached (the lock went with the
    /// session then).
    pub fn release_fence(&mut self) -> Result<()> {
        let Some(f) = &self.fence else {
            return Ok(());
        };
        f.lost.store(true, Ordering::SeqCst);
        let key = f.key;
        self.client
            .execute("SELECT pg_advisory_unlock($1)", &[&key])
            .map(|_| ())
            .map_err(to_error)
    }

    /// A session whose connection has ended (the server restarted, the
    /// network dropped it) is opened again before the next statement that
    /// begins outside a transaction; inside one, the statement fails, and
    /// so does the transaction, whose changes the server never committed.
    fn reconnect_if_closed(&mut self) -> Result<()> {
        if let Some(f) = &self.fence {
            if f.lost.load(Ordering::SeqCst) {
                return Err(fenced());
            }
        }
        if !self.client.is_closed() || self.depth > 0 {
            return Ok(());
        }
        let mut fresh = Self::connect(&self.url, &self.schema)?;
        if let Some(f) = self.fence.take() {
            if !try_lock(&mut fresh.client, f.key)? {
                tracing::error!(schema = %self.schema, "{FENCED}: this session writes no more");
                f.lost.store(true, Ordering::SeqCst);
                self.fence = Some(f);
                return Err(fenced());
            }
            fresh.fence = Some(f);
        }
        tracing::warn!(schema = %self.schema, "PostgreSQL session reopened after its connection ended");
        *self = fresh;
        Ok(())
    }

    /// The client, for what the shared interface has no method for
    /// (advisory locks, `LISTEN`).
    pub fn client(&mut self) -> &mut Client {
        &mut self.client
    }

    pub(crate) fn batch(&mut self, sql: &str) -> Result<()> {
        if sql == "BEGIN" {
            self.reconnect_if_closed()?;
        }
        self.client
            .batch_execute(&translate(sql))
            .map_err(|e| with_sql(e, sql))
    }

    /// The statement for `sql`, prepared once; `None` when PostgreSQL cannot
    /// tell a placeholder's type from the text alone (`?1 IS NULL`): it is
    /// then prepared at each run with the types of the values given
    /// ([`PgConn::typed`]).
    pub(crate) fn prepare(&mut self, sql: &str) -> Result<Option<postgres::Statement>> {
        self.reconnect_if_closed()?;
        if let Some(s) = self.cache.get(sql) {
            return Ok(Some(s.clone()));
        }
        match self.client.prepare(&translate(sql)) {
            Ok(stmt) => {
                self.cache.insert(sql.to_owned(), stmt.clone());
                Ok(Some(stmt))
            }
            Err(e) if matches!(e.code().map(|c| c.code()), Some("42P08") | Some("42P18")) => {
                Ok(None)
            }
            Err(e) => Err(with_sql(e, sql)),
        }
    }

    /// `sql` prepared with each placeholder typed as its value: integer
    /// `BIGINT`, real `DOUBLE PRECISION`, text and NULL `TEXT`, blob
    /// `BYTEA`.
    pub(crate) fn typed(&mut self, sql: &str, values: &[Value]) -> Result<postgres::Statement> {
        let types: Vec<PgType> = values
            .iter()
            .map(|v| match v {
                Value::Integer(_) => PgType::INT8,
                Value::Real(_) => PgType::FLOAT8,
                Value::Blob(_) => PgType::BYTEA,
                Value::Null | Value::Text(_) => PgType::TEXT,
            })
            .collect();
        let key = format!(
            "{sql}\u{0}{}",
            types.iter().map(|t| t.name()).collect::<Vec<_>>().join(",")
        );
        if let Some(s) = self.cache.get(&key) {
            return Ok(s.clone());
        }
        let stmt = self
            .client
            .prepare_typed(&translate(sql), &types)
            .map_err(|e| with_sql(e, sql))?;
        self.cache.insert(key, stmt.clone());
        Ok(stmt)
    }

    pub(crate) fn execute(
        &mut self,
        stmt: &postgres::Statement,
        values: &[Value],
    ) -> Result<usize> {
        let params = bind(stmt, values)?;
        let refs: Vec<&(dyn PgToSql + Sync)> = params.iter().map(|p| p as _).collect();
        self.client
            .execute(stmt, &refs)
            .map(|n| n as usize)
            .map_err(to_error)
    }

    pub(crate) fn query(
        &mut self,
        stmt: &postgres::Statement,
        values: &[Value],
    ) -> Result<Vec<postgres::Row>> {
        let params = bind(stmt, values)?;
        let refs: Vec<&(dyn PgToSql + Sync)> = params.iter().map(|p| p as _).collect();
        self.client.query(stmt, &refs).map_err(to_error)
    }
}

/// `pg_try_advisory_lock(key)` on `client`.
fn try_lock(client: &mut Client, key: i64) -> Result<bool> {
    client
        .query_one("SELECT pg_try_advisory_lock($1)", &[&key])
        .and_then(|r| r.try_get(0))
        .map_err(to_error)
}

/// The error of a session that lost its advisory lock ([`FENCED`]).
fn fenced() -> Error {
    Error::SqliteFailure(ffi::Error::new(ffi::SQLITE_BUSY), Some(FENCED.to_owned()))
}

/// [`to_error`], naming the statement (its first 300 characters).
fn with_sql(e: postgres::Error, sql: &str) -> Error {
    match to_error(e) {
        Error::SqliteFailure(code, Some(msg)) => {
            let flat: String = sql.split_whitespace().collect::<Vec<_>>().join(" ");
            let shown: String = flat.chars().take(300).collect();
            Error::SqliteFailure(code, Some(format!("{msg} (in `{shown}`)")))
        }
        other => other,
    }
}

fn quote_ident(name: &str) -> String {
    format!("\"{}\"", name.replace('"', "\"\""))
}

/// A parameter bound as the type PostgreSQL inferred for its placeholder.
#[derive(Debug)]
struct Param<'v>(&'v Value);

fn bind<'v>(stmt: &postgres::Statement, values: &'v [Value]) -> Result<Vec<Param<'v>>> {
    let expected = stmt.params().len();
    if values.len() != expected {
        return Err(Error::InvalidParameterCount(values.len(), expected));
    }
    Ok(values.iter().map(Param).collect())
}

type BoxError = Box<dyn StdError + Sync + Send>;

fn mismatch(v: &Value, ty: &PgType) -> BoxError {
    format!("cannot bind a {} value as PostgreSQL {}", v.data_type(), ty).into()
}

impl PgToSql for Param<'_> {
    fn to_sql(&self, ty: &PgType, out: &mut BytesMut) -> std::result::Result<IsNull, BoxError> {
        match self.0 {
            Value::Null => return Ok(IsNull::Yes),
            Value::Integer(i) => match *ty {
                PgType::INT8 => i.to_sql(ty, out)?,
                PgType::INT4 => i32::try_from(*i)?.to_sql(ty, out)?,
                PgType::INT2 => i16::try_from(*i)?.to_sql(ty, out)?,
                PgType::FLOAT8 => (*i as f64).to_sql(ty, out)?,
                PgType::FLOAT4 => (*i as f32).to_sql(ty, out)?,
                PgType::BOOL => (*i != 0).to_sql(ty, out)?,
                PgType::TEXT
                | PgType::VARCHAR
                | PgType::BPCHAR
                | PgType::NAME
                | PgType::UNKNOWN => {
                    out.extend_from_slice(i.to_string().as_bytes());
                    IsNull::No
                }
                _ => return Err(mismatch(self.0, ty)),
            },
            Value::Real(f) => match *ty {
                PgType::FLOAT8 => f.to_sql(ty, out)?,
                PgType::FLOAT4 => (*f as f32).to_sql(ty, out)?,
                PgType::TEXT | PgType::VARCHAR | PgType::UNKNOWN => {
                    out.extend_from_slice(f.to_string().as_bytes());
                    IsNull::No
                }
                _ => return Err(mismatch(self.0, ty)),
            },
            Value::Text(s) => match *ty {
                PgType::TEXT
                | PgType::VARCHAR
                | PgType::BPCHAR
                | PgType::NAME
                | PgType::UNKNOWN
                | PgType::JSON => {
                    out.extend_from_slice(s.as_bytes());
                    IsNull::No
                }
                PgType::JSONB => {
                    out.extend_from_slice(&[1]);
                    out.extend_from_slice(s.as_bytes());
                    IsNull::No
                }
                PgType::INT8 => s.parse::<i64>()?.to_sql(ty, out)?,
                PgType::INT4 => s.parse::<i32>()?.to_sql(ty, out)?,
                PgType::FLOAT8 => s.parse::<f64>()?.to_sql(ty, out)?,
                PgType::BYTEA => {
                    out.extend_from_slice(s.as_bytes());
                    IsNull::No
                }
                _ => return Err(mismatch(self.0, ty)),
            },
            Value::Blob(b) => match *ty {
                PgType::BYTEA => {
                    out.extend_from_slice(b);
                    IsNull::No
                }
                PgType::TEXT | PgType::UNKNOWN => {
                    out.extend_from_slice(std::str::from_utf8(b)?.as_bytes());
                    IsNull::No
                }
                _ => return Err(mismatch(self.0, ty)),
            },
        };
        Ok(IsNull::No)
    }

    fn accepts(_: &PgType) -> bool {
        true
    }

    postgres::types::to_sql_checked!();
}

/// A column read as whatever SQLite type its PostgreSQL type maps to.
struct Cell(Value);

impl<'a> FromSql<'a> for Cell {
    fn from_sql(ty: &PgType, raw: &'a [u8]) -> std::result::Result<Self, BoxError> {
        Ok(Cell(match *ty {
            PgType::INT8 => Value::Integer(i64::from_sql(ty, raw)?),
            PgType::INT4 => Value::Integer(i32::from_sql(ty, raw)?.into()),
            PgType::INT2 => Value::Integer(i16::from_sql(ty, raw)?.into()),
            PgType::OID => Value::Integer(u32::from_sql(ty, raw)?.into()),
            PgType::BOOL => Value::Integer(bool::from_sql(ty, raw)?.into()),
            PgType::FLOAT8 => Value::Real(f64::from_sql(ty, raw)?),
            PgType::FLOAT4 => Value::Real(f32::from_sql(ty, raw)?.into()),
            PgType::NUMERIC => numeric(raw)?,
            PgType::BYTEA => Value::Blob(raw.to_vec()),
            PgType::JSONB => {
                Value::Text(std::str::from_utf8(raw.get(1..).unwrap_or(&[]))?.to_owned())
            }
            _ => Value::Text(std::str::from_utf8(raw)?.to_owned()),
        }))
    }

    fn from_sql_null(_: &PgType) -> std::result::Result<Self, BoxError> {
        Ok(Cell(Value::Null))
    }

    fn accepts(_: &PgType) -> bool {
        true
    }
}

/// A `NUMERIC` (what `sum()` of a `BIGINT` returns) as an integer when it
/// has no fraction and fits, else as a real.
fn numeric(raw: &[u8]) -> std::result::Result<Value, BoxError> {
    let word = |i: usize| -> std::result::Result<i16, BoxError> {
        let b = raw.get(i..i + 2).ok_or("short NUMERIC")?;
        Ok(i16::from_be_bytes([b[0], b[1]]))
    };
    let ndigits = word(0)? as usize;
    let weight = word(2)? as i32;
    let sign = word(4)? as u16;
    let scale = word(6)?;
    if sign == 0xC000 {
        return Ok(Value::Real(f64::NAN));
    }
    let mut f = 0f64;
    let mut int: Option<i128> = Some(0);
    for d in 0..ndigits {
        let digit = word(8 + 2 * d)? as i128;
        let power = weight - d as i32;
        f += digit as f64 * 10_000f64.powi(power);
        int = match (int, power >= 0) {
            (Some(acc), true) => 10_000i128
                .checked_pow(power as u32)
                .and_then(|p| p.checked_mul(digit))
                .and_then(|v| acc.checked_add(v)),
            (Some(acc), false) if digit == 0 => Some(acc),
            _ => None,
        };
    }
    let negative = sign == 0x4000;
    match int.and_then(|i| i64::try_from(if negative { -i } else { i }).ok()) {
        Some(i) if scale == 0 || f.fract() == 0.0 => Ok(Value::Integer(i)),
        _ => Ok(Value::Real(if negative { -f } else { f })),
    }
}

/// Column `idx` of `row` as a SQLite value.
pub(crate) fn column(row: &postgres::Row, idx: usize) -> Result<Value> {
    if idx >= row.len() {
        return Err(Error::InvalidColumnIndex(idx));
    }
    row.try_get::<_, Cell>(idx)
        .map(|c| c.0)
        .map_err(|e| Error::FromSqlConversionFailure(idx, Type::Null, Box::new(e)))
}

/// A PostgreSQL error as the rusqlite error of the same class.
pub fn to_error(e: postgres::Error) -> Error {
    let code = match e.code().map(|c| c.code()) {
        Some("23505") => ffi::SQLITE_CONSTRAINT_UNIQUE,
        Some("23503") => ffi::SQLITE_CONSTRAINT_FOREIGNKEY,
        Some("23502") => ffi::SQLITE_CONSTRAINT_NOTNULL,
        Some("23514") => ffi::SQLITE_CONSTRAINT_CHECK,
        Some(c) if c.starts_with("23") => ffi::SQLITE_CONSTRAINT,
        Some("53100") => ffi::SQLITE_FULL,
        Some("40001") | Some("40P01") | Some("55P03") => ffi::SQLITE_BUSY,
        Some("57014") => ffi::SQLITE_INTERRUPT,
        Some(c) if c.starts_with("08") || c.starts_with("57") => ffi::SQLITE_IOERR,
        Some(_) => ffi::SQLITE_ERROR,
        None if e.is_closed()
            || StdError::source(&e)
                .is_some_and(|c| c.downcast_ref::<std::io::Error>().is_some()) =>
        {
            ffi::SQLITE_IOERR
        }
        None => ffi::SQLITE_ERROR,
    };
    let lost = code == ffi::SQLITE_IOERR;
    let message = match (e.as_db_error(), lost) {
        (Some(db), false) => format!("postgres {}: {}", db.code().code(), db.message()),
        (Some(db), true) => format!(
            "{}postgres {}: {}",
            crate::storage::UNREACHABLE,
            db.code().code(),
            db.message()
        ),
        (None, true) => format!("{}postgres: {e}", crate::storage::UNREACHABLE),
        (None, false) => format!("postgres: {e}"),
    };
    Error::SqliteFailure(ffi::Error::new(code), Some(message))
}

/// Words of SQLite's type names and their PostgreSQL spellings.
const TYPE_WORDS: &[(&str, &str)] = &[
    ("INTEGER", "BIGINT"),
    ("BLOB", "BYTEA"),
    ("REAL", "DOUBLE PRECISION"),
];

/// Rewrites a statement of the shared dialect for PostgreSQL: `?N` and `?`
/// placeholders become `$N`; the type names `INTEGER`, `BLOB` and `REAL`
/// become `BIGINT`, `BYTEA` and `DOUBLE PRECISION`; `INTEGER PRIMARY KEY
/// [AUTOINCREMENT]` becomes an identity column; `INDEXED BY` hints are
/// dropped; a `CREATE TABLE` without
/// one gets a `rowid` identity column, so `ORDER BY rowid` is insertion
/// order as on SQLite. Quoted text is left alone.
pub fn translate(sql: &str) -> String {
    with_rowid(&without_index_hints(&rewrite(sql)))
}

/// `sql` without SQLite's `INDEXED BY name` planner hints (PostgreSQL's
/// planner takes none).
fn without_index_hints(sql: &str) -> String {
    static HINT: std::sync::OnceLock<regex::Regex> = std::sync::OnceLock::new();
    HINT.get_or_init(|| regex::Regex::new(r"(?i)\bINDEXED\s+BY\s+[A-Za-z_][A-Za-z0-9_]*").unwrap())
        .replace_all(sql, "")
        .into_owned()
}

/// Adds `rowid BIGINT GENERATED ALWAYS AS IDENTITY` to each
/// `CREATE TABLE name (...)` of `sql` that has no identity column.
fn with_rowid(sql: &str) -> String {
    let upper = sql.to_ascii_uppercase();
    let mut out = String::with_capacity(sql.len());
    let mut at = 0;
    while let Some(found) = upper[at..].find("CREATE TABLE") {
        let start = at + found;
        let Some(open) = upper[start..].find('(').map(|i| start + i) else {
            break;
        };
        let head = &upper[start + "CREATE TABLE".len()..open];
        let plain_name = head.split_whitespace().all(|w| {
            w.bytes()
                .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'"')
        });
        let mut depth = 0usize;
        let mut close = None;
        for (i, b) in sql.bytes().enumerate().skip(open) {
            match b {
                b'(' => depth += 1,
                b')' => {
                    depth -= 1;
                    if depth == 0 {
                        close = Some(i);
                        break;
                    }
                }
                _ => {}
            }
        }
        let Some(close) = close else { break };
        out.push_str(&sql[at..close]);
        if plain_name && !upper[open..close].contains("IDENTITY") {
            out.push_str(",\n    rowid BIGINT GENERATED ALWAYS AS IDENTITY");
        }
        at = close;
    }
    out.push_str(&sql[at..]);
    out
}

fn rewrite(sql: &str) -> String {
    let mut out = String::with_capacity(sql.len() + 16);
    let mut next_param = 0u32;
    let bytes = sql.as_bytes();
    let mut i = 0;
    while i < bytes.len() {
        let c = bytes[i];
        match c {
            b'\'' | b'"' => {
                let end = sql[i + 1..]
                    .find(c as char)
                    .map_or(sql.len(), |j| i + 2 + j);
                out.push_str(&sql[i..end]);
                i = end;
            }
            b'-' if bytes.get(i + 1) == Some(&b'-') => {
                let end = sql[i..].find('\n').map_or(sql.len(), |j| i + j);
                out.push_str(&sql[i..end]);
                i = end;
            }
            b'?' => {
                let digits = sql[i + 1..].bytes().take_while(u8::is_ascii_digit).count();
                if digits == 0 {
                    next_param += 1;
                    out.push_str(&format!("${next_param}"));
                } else {
                    let n: u32 = sql[i + 1..i + 1 + digits].parse().unwrap_or(0);
                    next_param = next_param.max(n);
                    out.push('$');
                    out.push_str(&sql[i + 1..i + 1 + digits]);
                }
                i += 1 + digits;
            }
            c if c.is_ascii_alphabetic() || c == b'_' => {
                let len = sql[i..]
                    .bytes()
                    .take_while(|b| b.is_ascii_alphanumeric() || *b == b'_')
                    .count();
                let word = &sql[i..i + len];
                i += len;
                if word.eq_ignore_ascii_case("INTEGER") {
                    let rest = &sql[i..];
                    let key = rest.trim_start();
                    if starts_with_words(key, &["PRIMARY", "KEY", "AUTOINCREMENT"]) {
                        out.push_str("BIGINT GENERATED BY DEFAULT AS IDENTITY PRIMARY KEY");
                        i += rest.len() - key.len() + skip_words(key, 3);
                        continue;
                    }
                    if starts_with_words(key, &["PRIMARY", "KEY"]) {
                        out.push_str("BIGINT GENERATED BY DEFAULT AS IDENTITY PRIMARY KEY");
                        i += rest.len() - key.len() + skip_words(key, 2);
                        continue;
                    }
                }
                match TYPE_WORDS
                    .iter()
                    .find(|(from, _)| word.eq_ignore_ascii_case(from))
                {
                    Some((_, to)) => out.push_str(to),
                    None => out.push_str(word),
                }
            }
            _ => {
                let ch = sql[i..].chars().next().unwrap_or(' ');
                out.push(ch);
                i += ch.len_utf8();
            }
        }
    }
    out
}

fn starts_with_words(s: &str, words: &[&str]) -> bool {
    let mut it = s.split_whitespace();
    words.iter().all(|w| {
        it.next()
            .map(|t| t.trim_end_matches([',', ')']))
            .is_some_and(|t| t.eq_ignore_ascii_case(w))
    })
}

/// Bytes of `s` up to the end of its first `n` words.
fn skip_words(s: &str, n: usize) -> usize {
    let mut at = 0;
    for _ in 0..n {
        let rest = &s[at..];
        let start = rest.len() - rest.trim_start().len();
        let word = rest[start..]
            .bytes()
            .take_while(|b| b.is_ascii_alphanumeric() || *b == b'_')
            .count();
        at += start + word;
    }
    at
}
