//! The statements of [`PostgresCounter`](crate::PostgresCounter), for one table.

use crate::quote_table;

/// Every statement the counter sends, with the table name quoted in.
#[derive(Clone)]
pub(crate) struct CounterSql {
    /// One request on one resource (a batch of one: the common case when idle). `$1`: the
    /// resource. Returns its token.
    pub(crate) single: String,
    /// Single-resource requests on distinct resources, in one upsert. `$1`: the resources.
    /// Returns `(resource, token)` per request.
    pub(crate) distinct: String,
    /// A batch of single-resource requests, in one upsert (rows are created as needed).
    /// `$1`: the resource of each request, in arrival order. Returns `(ordinal, token)` per
    /// request: the `k`-th of `n` requests on a resource gets `last + k`, and the row
    /// ends at `last + n`.
    pub(crate) singles: String,
    /// A batch with a multi-resource request, over rows that exist. `$1`: every distinct
    /// resource of the batch; `$2`, `$3`: each request's resources flattened, with its
    /// 1-based arrival index. Locks the rows in sorted order, takes `base` = the largest
    /// `last_fence` among them, sets each row to `base` + the index of the last request on it
    /// and returns `(base, all rows found)`; request `i` gets `base + i`. Updates nothing if
    /// a row is missing.
    pub(crate) mixed: String,
    /// Creates the missing rows of `$1` (at 0), in sorted order.
    pub(crate) insert_missing: String,
    /// `CREATE TABLE IF NOT EXISTS`.
    pub(crate) create: String,
}

impl CounterSql {
    pub(crate) fn new(table: &str) -> Self {
        let t = quote_table(table);
        CounterSql {
            single: format!(
                "INSERT INTO {t} AS f (resource, last_fence) VALUES ($1, 1) \
                 ON CONFLICT (resource) DO UPDATE SET last_fence = f.last_fence + 1 \
                 RETURNING last_fence"
            ),
            distinct: format!(
                "INSERT INTO {t} AS f (resource, last_fence) \
                 SELECT r, 1 FROM unnest($1::text[]) AS r ORDER BY r \
                 ON CONFLICT (resource) DO UPDATE SET last_fence = f.last_fence + 1 \
                 RETURNING f.resource, f.last_fence"
            ),
            singles: format!(
                "WITH req AS (\
                     SELECT u.r, u.i FROM unnest($1::text[]) WITH ORDINALITY AS u(r, i)\
                 ), counts AS (\
                     SELECT r, count(*) AS n FROM req GROUP BY r\
                 ), bumped AS (\
                     INSERT INTO {t} AS f (resource, last_fence) \
                     SELECT r, n FROM counts ORDER BY r \
                     ON CONFLICT (resource) DO UPDATE SET last_fence = f.last_fence + EXCLUDED.last_fence \
                     RETURNING f.resource, f.last_fence\
                 ) \
                 SELECT req.i, \
                     b.last_fence - c.n + row_number() OVER (PARTITION BY req.r ORDER BY req.i) \
                 FROM req JOIN counts AS c ON c.r = req.r JOIN bumped AS b ON b.resource = req.r \
                 ORDER BY req.i"
            ),
            mixed: format!(
                "WITH locked AS (\
                     SELECT resource, last_fence FROM {t} \
                     WHERE resource = ANY($1) ORDER BY resource FOR UPDATE\
                 ), base AS (\
                     SELECT max(last_fence) AS b, count(*) AS found FROM locked\
                 ), latest AS (\
                     SELECT u.r, max(u.i) AS i FROM unnest($2::text[], $3::int8[]) AS u(r, i) \
                     GROUP BY u.r\
                 ), bumped AS (\
                     UPDATE {t} AS f SET last_fence = base.b + latest.i FROM base, latest \
                     WHERE f.resource = latest.r AND base.found = cardinality($1) \
                     RETURNING f.resource\
                 ) \
                 SELECT base.b, base.found = cardinality($1) FROM base"
            ),
            insert_missing: format!(
                "INSERT INTO {t} (resource, last_fence) \
                 SELECT r, 0 FROM unnest($1::text[]) AS r ORDER BY r \
                 ON CONFLICT (resource) DO NOTHING"
            ),
            create: format!(
                "CREATE TABLE IF NOT EXISTS {t} (\
                     resource text PRIMARY KEY, \
                     last_fence bigint NOT NULL CHECK (last_fence >= 0)\
                 )"
            ),
        }
    }
}
