//! One SQL interface over the two store backends, SQLite and PostgreSQL
//! (docs/scale.md, "The store").
//!
//! The registry's modules write their SQL once, in the dialect both engines
//! share, against [`Connection`], [`Statement`] and [`Row`]. Their method
//! names and shapes follow rusqlite's, whose parameter and value types
//! ([`ToSql`], [`types::FromSql`], [`params!`]) and error type ([`Error`])
//! are used as they are:
//!
//! - on SQLite every call goes straight to rusqlite;
//! - on PostgreSQL ([`pg`]) each statement's text is rewritten once when it
//!   is prepared (`?N` placeholders to `$N`, `INTEGER` to `BIGINT`, `BLOB`
//!   to `BYTEA`, `REAL` to `DOUBLE PRECISION`), values cross as rusqlite's
//!   [`types::Value`], and a server error comes back as
//!   [`Error::SqliteFailure`] with the SQLite code of the same class
//!   (a unique violation is `SQLITE_CONSTRAINT_UNIQUE`, a full disk
//!   `SQLITE_FULL`), its message naming PostgreSQL.
//!
//! What only one engine has (SQLite's pragmas and online backup) is
//! reached through [`Connection::as_sqlite`].

pub mod pg;

use std::cell::RefCell;
use std::ops::{Deref, DerefMut};

pub use rusqlite::types;
pub use rusqlite::{params, Error, OptionalExtension, Result, ToSql, TransactionBehavior};

use types::{FromSql, FromSqlError, Value, ValueRef};

/// Which engine a [`Connection`] talks to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Backend {
    Sqlite,
    Postgres,
}

impl Backend {
    /// `sqlite` or `postgres`, as `[store] backend` spells it.
    pub fn as_str(self) -> &'static str {
        match self {
            Backend::Sqlite => "sqlite",
            Backend::Postgres => "postgres",
        }
    }
}

/// Positional parameters of one statement: `[]`, [`params!`]`[a, b]`, an
/// array or slice of values, or [`params_from_iter`].
pub trait Params {
    /// Calls `f` with each parameter in order, from the first (`?1`).
    fn each(&self, f: &mut dyn FnMut(&dyn ToSql) -> Result<()>) -> Result<()>;
}

impl Params for [&(dyn ToSql + Send + Sync); 0] {
    fn each(&self, _: &mut dyn FnMut(&dyn ToSql) -> Result<()>) -> Result<()> {
        Ok(())
    }
}

impl<T: ToSql> Params for &[T] {
    fn each(&self, f: &mut dyn FnMut(&dyn ToSql) -> Result<()>) -> Result<()> {
        self.iter().try_for_each(|p| f(p))
    }
}

impl<T: ToSql, const N: usize> Params for &[T; N] {
    fn each(&self, f: &mut dyn FnMut(&dyn ToSql) -> Result<()>) -> Result<()> {
        self.iter().try_for_each(|p| f(p))
    }
}

macro_rules! params_for_arrays {
    ($($n:literal)*) => {$(
        impl<T: ToSql> Params for [T; $n] {
            fn each(&self, f: &mut dyn FnMut(&dyn ToSql) -> Result<()>) -> Result<()> {
                self.iter().try_for_each(|p| f(p))
            }
        }
    )*};
}

params_for_arrays!(1 2 3 4 5 6 7 8 9 10 11 12 13 14 15 16 17 18 19 20 21 22 23 24 25 26 27 28 29 30 31 32);

/// A column of a [`Row`]: its index, from 0.
pub trait ColumnIndex {
    /// The index.
    fn index(&self) -> usize;
}

impl ColumnIndex for usize {
    fn index(&self) -> usize {
        *self
    }
}

/// Parameters from an iterator of values (e.g. a `Vec<Value>` built for a
/// query whose filters vary), made by [`params_from_iter`].
pub struct ParamsFromIter<I>(RefCell<Option<I>>);

/// The items of `iter` as the parameters of one statement.
pub fn params_from_iter<I>(iter: I) -> ParamsFromIter<I::IntoIter>
where
    I: IntoIterator,
    I::Item: ToSql,
{
    ParamsFromIter(RefCell::new(Some(iter.into_iter())))
}

impl<I> Params for ParamsFromIter<I>
where
    I: Iterator,
    I::Item: ToSql,
{
    fn each(&self, f: &mut dyn FnMut(&dyn ToSql) -> Result<()>) -> Result<()> {
        let iter = self.0.borrow_mut().take();
        for p in iter.into_iter().flatten() {
            f(&p)?;
        }
        Ok(())
    }
}

/// A connection to the store: SQLite or PostgreSQL. Not `Sync`; each
/// database thread owns its own.
pub struct Connection {
    inner: Inner,
    /// How [`Connection::transaction`] begins on SQLite.
    behavior: TransactionBehavior,
}

enum Inner {
    Sqlite(rusqlite::Connection),
    Pg(Box<RefCell<pg::PgConn>>),
}

impl Connection {
    /// Wraps an open SQLite connection whose transactions begin as
    /// `behavior` (the writer uses `Immediate`: it takes the write lock at
    /// `BEGIN`).
    pub fn sqlite(conn: rusqlite::Connection, behavior: TransactionBehavior) -> Self {
        Self {
            inner: Inner::Sqlite(conn),
            behavior,
        }
    }

    /// Wraps an open PostgreSQL connection.
    pub fn postgres(conn: pg::PgConn) -> Self {
        Self {
            inner: Inner::Pg(Box::new(RefCell::new(conn))),
            behavior: TransactionBehavior::Deferred,
        }
    }

    /// Opens (creating if needed) the SQLite file at `path`, waiting up to
    /// 5 s for a lock another process holds (the CLI beside a running
    /// registry).
    ///
    /// Errors: the file cannot be opened.
    pub fn open(path: impl AsRef<std::path::Path>) -> Result<Self> {
        let conn = rusqlite::Connection::open(path)?;
        conn.busy_timeout(std::time::Duration::from_secs(5))?;
        Ok(Self::sqlite(conn, TransactionBehavior::Deferred))
    }

    /// Opens the SQLite file at `path` read-only (beside a running
    /// registry: WAL lets it read while the registry writes), waiting up to
    /// 5 s for a lock.
    ///
    /// Errors: the file is missing or cannot be opened.
    pub fn open_read_only(path: impl AsRef<std::path::Path>) -> Result<Self> {
        let conn = rusqlite::Connection::open_with_flags(
            path,
            rusqlite::OpenFlags::SQLITE_OPEN_READ_ONLY | rusqlite::OpenFlags::SQLITE_OPEN_NO_MUTEX,
        )?;
        conn.busy_timeout(std::time::Duration::from_secs(5))?;
        Ok(Self::sqlite(conn, TransactionBehavior::Deferred))
    }

    /// An in-memory SQLite database (tests, `check-config`).
    ///
    /// Errors: SQLite cannot allocate it.
    pub fn open_in_memory() -> Result<Self> {
        Ok(Self::sqlite(
            rusqlite::Connection::open_in_memory()?,
            TransactionBehavior::Deferred,
        ))
    }

    /// The engine behind this connection.
    pub fn backend(&self) -> Backend {
        match self.inner {
            Inner::Sqlite(_) => Backend::Sqlite,
            Inner::Pg(_) => Backend::Postgres,
        }
    }

    /// The SQLite connection, when this is one (pragmas, backup).
    pub fn as_sqlite(&self) -> Option<&rusqlite::Connection> {
        match &self.inner {
            Inner::Sqlite(c) => Some(c),
            Inner::Pg(_) => None,
        }
    }

    /// PostgreSQL: let go of the advisory lock this session holds
    /// ([`pg::PgConn::try_fence`]) and write no more on it; SQLite:
    /// nothing. The registry's last step when it stops, so that the next
    /// registry on the store need not wait for this session to close.
    ///
    /// Errors: the server cannot be reached (the lock then went with the
    /// session).
    pub fn release_fence(&self) -> Result<()> {
        match &self.inner {
            Inner::Sqlite(_) => Ok(()),
            Inner::Pg(c) => c.borrow_mut().release_fence(),
        }
    }

    /// Runs one or more statements without parameters (schema changes).
    ///
    /// Errors: the first statement that fails; those before it stay run
    /// unless a transaction encloses them.
    pub fn execute_batch(&self, sql: &str) -> Result<()> {
        match &self.inner {
            Inner::Sqlite(c) => c.execute_batch(sql),
            Inner::Pg(c) => c.borrow_mut().batch(sql),
        }
    }

    /// Runs one statement and returns how many rows it changed.
    pub fn execute<P: Params>(&self, sql: &str, params: P) -> Result<usize> {
        self.prepare_cached(sql)?.execute(params)
    }

    /// Runs a query and maps its first row with `f`.
    ///
    /// Errors: [`Error::QueryReturnedNoRows`] when there is none.
    pub fn query_row<T, P, F>(&self, sql: &str, params: P, f: F) -> Result<T>
    where
        P: Params,
        F: FnOnce(&Row<'_>) -> Result<T>,
    {
        self.prepare_cached(sql)?.query_row(params, f)
    }

    /// Prepares `sql`, keeping it for the next call with the same text.
    pub fn prepare_cached(&self, sql: &str) -> Result<Statement<'_>> {
        match &self.inner {
            Inner::Sqlite(c) => Ok(Statement(Stmt::Sqlite(SqliteStmt::Cached(
                c.prepare_cached(sql)?,
            )))),
            Inner::Pg(c) => {
                let stmt = c.borrow_mut().prepare(sql)?;
                Ok(Statement(Stmt::Pg {
                    conn: c,
                    sql: sql.to_owned(),
                    stmt,
                }))
            }
        }
    }

    /// Prepares `sql` (on PostgreSQL this is [`Connection::prepare_cached`]).
    pub fn prepare(&self, sql: &str) -> Result<Statement<'_>> {
        match &self.inner {
            Inner::Sqlite(c) => Ok(Statement(Stmt::Sqlite(SqliteStmt::Owned(c.prepare(sql)?)))),
            Inner::Pg(_) => self.prepare_cached(sql),
        }
    }

    /// Begins a transaction, committed by [`Transaction::commit`] and rolled
    /// back when dropped without it.
    pub fn transaction(&mut self) -> Result<Transaction<'_>> {
        let behavior = self.behavior;
        self.transaction_with_behavior(behavior)
    }

    /// [`Connection::transaction`] with SQLite's `behavior` (PostgreSQL
    /// always begins `READ COMMITTED`; its writes lock rows as they go).
    pub fn transaction_with_behavior(
        &mut self,
        behavior: TransactionBehavior,
    ) -> Result<Transaction<'_>> {
        let begin = match (&self.inner, behavior) {
            (Inner::Pg(_), _) => "BEGIN",
            (_, TransactionBehavior::Immediate) => "BEGIN IMMEDIATE",
            (_, TransactionBehavior::Exclusive) => "BEGIN EXCLUSIVE",
            _ => "BEGIN DEFERRED",
        };
        self.execute_batch(begin)?;
        self.set_depth(1);
        Ok(Transaction {
            conn: self,
            done: false,
        })
    }

    /// Begins a transaction left open until [`Connection::commit`] (a group
    /// commit, whose writes each take the connection itself).
    pub fn begin(&mut self) -> Result<()> {
        std::mem::forget(self.transaction()?);
        Ok(())
    }

    /// Commits the transaction [`Connection::begin`] opened; when the commit
    /// fails, rolls it back (nothing of it is stored).
    pub fn commit(&mut self) -> Result<()> {
        Transaction {
            conn: self,
            done: false,
        }
        .commit()
    }

    /// Begins a savepoint: a nested transaction inside one already open, or
    /// a transaction of its own outside any.
    pub fn savepoint(&mut self) -> Result<Savepoint<'_>> {
        let depth = self.depth() + 1;
        let name = format!("benchlink_sp{depth}");
        if self.depth() == 0 && self.backend() == Backend::Postgres {
            // PostgreSQL has no savepoint outside a transaction.
            self.execute_batch("BEGIN")?;
            self.set_depth(1);
            self.execute_batch(&format!("SAVEPOINT {name}"))?;
            self.set_depth(2);
            return Ok(Savepoint {
                conn: self,
                name,
                outer: true,
                done: false,
            });
        }
        self.execute_batch(&format!("SAVEPOINT {name}"))?;
        self.set_depth(depth);
        Ok(Savepoint {
            conn: self,
            name,
            outer: false,
            done: false,
        })
    }

    /// Id of the last row inserted by this connection into a table with an
    /// integer key (SQLite's rowid; PostgreSQL's `lastval()`).
    pub fn last_insert_rowid(&self) -> i64 {
        match &self.inner {
            Inner::Sqlite(c) => c.last_insert_rowid(),
            Inner::Pg(_) => self
                .query_row("SELECT lastval()", [], |r| r.get(0))
                .unwrap_or(0),
        }
    }

    /// Whether no transaction is open.
    pub fn is_autocommit(&self) -> bool {
        match &self.inner {
            Inner::Sqlite(c) => c.is_autocommit(),
            Inner::Pg(c) => c.borrow().depth == 0,
        }
    }

    /// Whether `table` has a column `column` (a migration adding one).
    pub fn has_column(&self, table: &str, column: &str) -> Result<bool> {
        let sql = match self.backend() {
            Backend::Sqlite => "SELECT count(*) FROM pragma_table_info(?1) WHERE name = ?2",
            Backend::Postgres => {
                "SELECT count(*) FROM information_schema.columns
                 WHERE table_schema = current_schema() AND table_name = ?1 AND column_name = ?2"
            }
        };
        let n: i64 = self.query_row(sql, [table, column], |r| r.get(0))?;
        Ok(n > 0)
    }

    /// Whether a table named `table` exists.
    pub fn has_table(&self, table: &str) -> Result<bool> {
        let sql = match self.backend() {
            Backend::Sqlite => {
                "SELECT count(*) FROM sqlite_master WHERE type = 'table' AND name = ?1"
            }
            Backend::Postgres => {
                "SELECT count(*) FROM information_schema.tables
                 WHERE table_schema = current_schema() AND table_name = ?1"
            }
        };
        let n: i64 = self.query_row(sql, [table], |r| r.get(0))?;
        Ok(n > 0)
    }

    /// Makes `table` append-only: an `UPDATE` or `DELETE` of its rows fails
    /// with a constraint error saying `why` (SQLite triggers
    /// `{table}_no_update` and `{table}_no_delete`; a PostgreSQL trigger
    /// `{table}_append_only`). `table` and `why` are the caller's own
    /// literals, never input.
    pub fn append_only(&self, table: &str, why: &str) -> Result<()> {
        match self.backend() {
            Backend::Sqlite => self.execute_batch(&format!(
                "CREATE TRIGGER IF NOT EXISTS {table}_no_update BEFORE UPDATE ON {table}
                    BEGIN SELECT RAISE(ABORT, '{why}'); END;
                 CREATE TRIGGER IF NOT EXISTS {table}_no_delete BEFORE DELETE ON {table}
                    BEGIN SELECT RAISE(ABORT, '{why}'); END;"
            )),
            Backend::Postgres => self.execute_batch(&format!(
                "CREATE OR REPLACE FUNCTION benchlink_refuse_change() RETURNS trigger
                    LANGUAGE plpgsql AS $body$
                    BEGIN
                        RAISE EXCEPTION '%', TG_ARGV[0] USING ERRCODE = 'integrity_constraint_violation';
                    END $body$;
                 CREATE OR REPLACE TRIGGER {table}_append_only BEFORE UPDATE OR DELETE ON {table}
                    FOR EACH ROW EXECUTE FUNCTION benchlink_refuse_change('{why}');"
            )),
        }
    }

    /// A table of the texts in the JSON array `expr` (a column holding JSON
    /// text), one per row in a column named `value`: for `EXISTS (SELECT 1
    /// FROM {..} WHERE value = ?)`.
    pub fn json_texts(&self, expr: &str) -> String {
        match self.backend() {
            Backend::Sqlite => format!("json_each({expr})"),
            Backend::Postgres => {
                format!("json_array_elements_text(CAST({expr} AS json)) AS je(value)")
            }
        }
    }

    /// Milliseconds from the RFC 3339 time `earlier` to `later` (two SQL
    /// expressions), as an integer expression.
    pub fn millis_between(&self, later: &str, earlier: &str) -> String {
        match self.backend() {
            Backend::Sqlite => {
                format!("CAST((julianday({later}) - julianday({earlier})) * 86400000 AS INTEGER)")
            }
            Backend::Postgres => format!(
                "CAST(EXTRACT(EPOCH FROM (CAST({later} AS timestamptz) - CAST({earlier} AS timestamptz))) * 1000 AS BIGINT)"
            ),
        }
    }

    fn depth(&self) -> u32 {
        match &self.inner {
            Inner::Sqlite(c) => u32::from(!c.is_autocommit()),
            Inner::Pg(c) => c.borrow().depth,
        }
    }

    fn set_depth(&self, depth: u32) {
        if let Inner::Pg(c) = &self.inner {
            c.borrow_mut().depth = depth;
        }
    }
}

/// An open transaction; derefs to its [`Connection`].
pub struct Transaction<'c> {
    conn: &'c mut Connection,
    done: bool,
}

impl Transaction<'_> {
    /// Commits.
    ///
    /// Errors: the commit failed (then nothing of it is stored).
    pub fn commit(mut self) -> Result<()> {
        self.done = true;
        let out = self.conn.execute_batch("COMMIT");
        if out.is_err() && !self.conn.is_autocommit() {
            let _ = self.conn.execute_batch("ROLLBACK");
        }
        self.conn.set_depth(0);
        out
    }

    /// Rolls back.
    pub fn rollback(mut self) -> Result<()> {
        self.done = true;
        self.conn.set_depth(0);
        self.conn.execute_batch("ROLLBACK")
    }
}

impl Deref for Transaction<'_> {
    type Target = Connection;
    fn deref(&self) -> &Connection {
        self.conn
    }
}

impl DerefMut for Transaction<'_> {
    fn deref_mut(&mut self) -> &mut Connection {
        self.conn
    }
}

impl Drop for Transaction<'_> {
    fn drop(&mut self) {
        if !self.done {
            self.conn.set_depth(0);
            let _ = self.conn.execute_batch("ROLLBACK");
        }
    }
}

/// An open savepoint; derefs to its [`Connection`].
pub struct Savepoint<'c> {
    conn: &'c mut Connection,
    name: String,
    /// Whether this savepoint began the transaction around it (PostgreSQL
    /// outside any transaction).
    outer: bool,
    done: bool,
}

impl Savepoint<'_> {
    /// Releases the savepoint, keeping its changes in the transaction
    /// around it (or committing them, when there is none).
    pub fn commit(mut self) -> Result<()> {
        self.done = true;
        self.conn.set_depth(self.conn.depth().saturating_sub(1));
        self.conn.execute_batch(&format!("RELEASE {}", self.name))?;
        if self.outer {
            self.conn.set_depth(0);
            self.conn.execute_batch("COMMIT")?;
        }
        Ok(())
    }

    fn undo(&mut self) {
        self.done = true;
        let _ = self
            .conn
            .execute_batch(&format!("ROLLBACK TO {0}; RELEASE {0}", self.name));
        self.conn.set_depth(self.conn.depth().saturating_sub(1));
        if self.outer {
            self.conn.set_depth(0);
            let _ = self.conn.execute_batch("ROLLBACK");
        }
    }

    /// Undoes the savepoint's changes.
    pub fn rollback(mut self) -> Result<()> {
        self.undo();
        Ok(())
    }
}

impl Deref for Savepoint<'_> {
    type Target = Connection;
    fn deref(&self) -> &Connection {
        self.conn
    }
}

impl DerefMut for Savepoint<'_> {
    fn deref_mut(&mut self) -> &mut Connection {
        self.conn
    }
}

impl Drop for Savepoint<'_> {
    fn drop(&mut self) {
        if !self.done {
            self.undo();
        }
    }
}

enum SqliteStmt<'c> {
    Cached(rusqlite::CachedStatement<'c>),
    Owned(rusqlite::Statement<'c>),
}

impl<'c> SqliteStmt<'c> {
    fn get(&mut self) -> &mut rusqlite::Statement<'c> {
        match self {
            SqliteStmt::Cached(s) => s,
            SqliteStmt::Owned(s) => s,
        }
    }
}

/// A prepared statement.
pub struct Statement<'c>(Stmt<'c>);

enum Stmt<'c> {
    Sqlite(SqliteStmt<'c>),
    Pg {
        conn: &'c RefCell<pg::PgConn>,
        sql: String,
        /// `None`: typed by the values at each run.
        stmt: Option<postgres::Statement>,
    },
}

fn pg_stmt(
    conn: &RefCell<pg::PgConn>,
    sql: &str,
    stmt: &Option<postgres::Statement>,
    values: &[Value],
) -> Result<postgres::Statement> {
    match stmt {
        Some(s) => Ok(s.clone()),
        None => conn.borrow_mut().typed(sql, values),
    }
}

fn bind_sqlite<P: Params>(stmt: &mut rusqlite::Statement<'_>, params: &P) -> Result<()> {
    let mut i = 0;
    params.each(&mut |p| {
        i += 1;
        stmt.raw_bind_parameter(i, p)
    })?;
    if i != stmt.parameter_count() {
        return Err(Error::InvalidParameterCount(i, stmt.parameter_count()));
    }
    Ok(())
}

fn owned(v: ValueRef<'_>) -> Value {
    match v {
        ValueRef::Null => Value::Null,
        ValueRef::Integer(i) => Value::Integer(i),
        ValueRef::Real(f) => Value::Real(f),
        ValueRef::Text(t) => Value::Text(String::from_utf8_lossy(t).into_owned()),
        ValueRef::Blob(b) => Value::Blob(b.to_vec()),
    }
}

fn collect<P: Params>(params: &P) -> Result<Vec<Value>> {
    let mut out = Vec::new();
    params.each(&mut |p| {
        out.push(match p.to_sql()? {
            types::ToSqlOutput::Borrowed(v) => owned(v),
            types::ToSqlOutput::Owned(v) => v,
            _ => {
                return Err(Error::ToSqlConversionFailure(
                    "unsupported parameter".into(),
                ))
            }
        });
        Ok(())
    })?;
    Ok(out)
}

impl Statement<'_> {
    /// Runs the statement and returns how many rows it changed.
    pub fn execute<P: Params>(&mut self, params: P) -> Result<usize> {
        match &mut self.0 {
            Stmt::Sqlite(s) => {
                let s = s.get();
                bind_sqlite(s, &params)?;
                s.raw_execute()
            }
            Stmt::Pg { conn, sql, stmt } => {
                let values = collect(&params)?;
                let stmt = pg_stmt(conn, sql, stmt, &values)?;
                conn.borrow_mut().execute(&stmt, &values)
            }
        }
    }

    /// Runs the query and maps its first row with `f`.
    ///
    /// Errors: [`Error::QueryReturnedNoRows`] when there is none.
    pub fn query_row<T, P, F>(&mut self, params: P, f: F) -> Result<T>
    where
        P: Params,
        F: FnOnce(&Row<'_>) -> Result<T>,
    {
        let mut rows = self.query(params)?;
        match rows.next()? {
            Some(r) => f(&r),
            None => Err(Error::QueryReturnedNoRows),
        }
    }

    /// Runs the query; step through its rows with [`Rows::next`].
    pub fn query<P: Params>(&mut self, params: P) -> Result<Rows<'_>> {
        match &mut self.0 {
            Stmt::Sqlite(s) => {
                let s = s.get();
                bind_sqlite(s, &params)?;
                Ok(Rows::Sqlite(s.raw_query()))
            }
            Stmt::Pg { conn, sql, stmt } => {
                let values = collect(&params)?;
                let stmt = pg_stmt(conn, sql, stmt, &values)?;
                let rows = conn.borrow_mut().query(&stmt, &values)?;
                Ok(Rows::Pg {
                    rows,
                    at: 0,
                    _stmt: std::marker::PhantomData,
                })
            }
        }
    }

    /// Runs the query and maps each row with `f`.
    pub fn query_map<T, P, F>(&mut self, params: P, f: F) -> Result<MappedRows<'_, F>>
    where
        P: Params,
        F: FnMut(&Row<'_>) -> Result<T>,
    {
        Ok(MappedRows {
            rows: self.query(params)?,
            f,
        })
    }

    /// Whether the query returns a row.
    pub fn exists<P: Params>(&mut self, params: P) -> Result<bool> {
        Ok(self.query(params)?.next()?.is_some())
    }
}

/// The rows of a running query.
pub enum Rows<'s> {
    #[doc(hidden)]
    Sqlite(rusqlite::Rows<'s>),
    #[doc(hidden)]
    Pg {
        rows: Vec<postgres::Row>,
        at: usize,
        _stmt: std::marker::PhantomData<&'s ()>,
    },
}

impl Rows<'_> {
    /// The next row, or `None` after the last.
    #[allow(clippy::should_implement_trait)]
    pub fn next(&mut self) -> Result<Option<Row<'_>>> {
        match self {
            Rows::Sqlite(r) => Ok(r.next()?.map(Row::Sqlite)),
            Rows::Pg { rows, at, .. } => {
                let row = rows.get(*at);
                *at += 1;
                Ok(row.map(Row::Pg))
            }
        }
    }
}

/// The rows of [`Statement::query_map`], each mapped.
pub struct MappedRows<'s, F> {
    rows: Rows<'s>,
    f: F,
}

impl<T, F> Iterator for MappedRows<'_, F>
where
    F: FnMut(&Row<'_>) -> Result<T>,
{
    type Item = Result<T>;

    fn next(&mut self) -> Option<Result<T>> {
        match self.rows.next() {
            Ok(Some(r)) => Some((self.f)(&r)),
            Ok(None) => None,
            Err(e) => Some(Err(e)),
        }
    }
}

/// One row of a query's result.
#[derive(Clone, Copy)]
pub enum Row<'r> {
    #[doc(hidden)]
    Sqlite(&'r rusqlite::Row<'r>),
    #[doc(hidden)]
    Pg(&'r postgres::Row),
}

impl Row<'_> {
    /// Column `idx` (from 0) as `T`.
    ///
    /// Errors: [`Error::InvalidColumnIndex`]; [`Error::InvalidColumnType`]
    /// when the value is not of `T`'s kind (text for an integer);
    /// [`Error::FromSqlConversionFailure`] when it does not fit `T`.
    pub fn get<I: ColumnIndex, T: FromSql>(&self, idx: I) -> Result<T> {
        let idx = idx.index();
        match self {
            Row::Sqlite(r) => r.get(idx),
            Row::Pg(r) => {
                let value = pg::column(r, idx)?;
                T::column_result(ValueRef::from(&value)).map_err(|e| match e {
                    FromSqlError::InvalidType => Error::InvalidColumnType(
                        idx,
                        r.columns()[idx].name().to_owned(),
                        value.data_type(),
                    ),
                    FromSqlError::OutOfRange(i) => Error::IntegralValueOutOfRange(idx, i),
                    FromSqlError::Other(err) => {
                        Error::FromSqlConversionFailure(idx, value.data_type(), err)
                    }
                    other => {
                        Error::FromSqlConversionFailure(idx, value.data_type(), Box::new(other))
                    }
                })
            }
        }
    }

    /// Column `idx` as an owned value of whatever type it holds.
    pub fn get_value(&self, idx: usize) -> Result<Value> {
        self.get(idx)
    }
}

#[cfg(test)]
mod tests;
