//! Plan inspection: `EXPLAIN (ANALYZE, BUFFERS)` of the pick's and the head
//! advance's lookups, summarized.

use diesel::sql_types::Text;
use diesel::QueryableByName;
use diesel_async::{AsyncPgConnection, RunQueryDsl, SimpleAsyncConnection};
use serde_json::{json, Value};

use super::{Dump, Number};
use crate::progress;

/// A statement of one of the schema's functions, copied from
/// `migrations/0001_init/up.sql`, to be explained on its own: its variables
/// become parameters of the given types, bound to the given values.
pub(super) struct Lookup {
    /// Name in the output.
    pub(super) label: &'static str,
    /// The function that runs it (its settings, e.g. `enable_sort = off`,
    /// apply; its source must still contain the statement).
    function: &'static str,
    /// The statement as written in the function (whitespace aside).
    sql: &'static str,
    /// The statement's variables: name, SQL type, value for the EXPLAIN.
    params: &'static [(&'static str, &'static str, &'static str)],
}

/// The pick's statements on `queue_group` (find the highest priority with
/// active groups; read the candidate groups from the cursor on; lock one by
/// key) and `complete`'s look-up of a group's next head (run by every
/// completion). The cursor range is fixed here (the runner passes the slot
/// after the group it served last); the job id of the next-head lookup is the
/// first job's, substituted at run time.
pub(super) const LOOKUPS: &[Lookup] = &[
    Lookup {
        label: "priority_lookup",
        function: "pgfifo.pick",
        sql: "SELECT g.priority INTO v_prio FROM pgfifo.queue_group AS g
              WHERE g.queue = v_q AND g.ready_at IS NOT NULL AND g.priority < v_bound
              ORDER BY g.priority DESC LIMIT 1",
        params: &[("v_q", "text", "'bench'"), ("v_bound", "integer", "32768")],
    },
    Lookup {
        label: "group_lookup",
        function: "pgfifo.pick",
        sql: "SELECT g.group_id FROM pgfifo.queue_group AS g
              WHERE g.queue = v_q AND g.ready_at IS NOT NULL AND g.priority = v_prio
                AND g.slot BETWEEN v_lo AND v_hi AND g.ready_at <= v_now
              ORDER BY g.slot",
        params: &[
            ("v_q", "text", "'bench'"),
            ("v_prio", "smallint", "0"),
            ("v_lo", "bigint", "0"),
            ("v_hi", "bigint", "2147483647"),
            ("v_now", "timestamptz", "statement_timestamp()"),
        ],
    },
    Lookup {
        label: "next_head_lookup",
        function: "pgfifo.complete",
        sql: "SELECT j.id, j.priority, j.run_after FROM pgfifo.job AS j
            WHERE j.queue = q AND j.group_id = grp AND j.state = 'queued' AND j.id <> done_id
            ORDER BY j.id LIMIT 1",
        params: &[
            ("q", "text", "'bench'"),
            ("grp", "text", "'g0'"),
            ("done_id", "bigint", "$FIRST"),
        ],
    },
];

/// Runs `EXPLAIN` of a statement given as text and returns the JSON plan as
/// text (diesel cannot read EXPLAIN's column, named "QUERY PLAN").
pub(super) const EXPLAIN_FUNCTION: &str = "\
CREATE OR REPLACE FUNCTION pg_temp.bench_explain(p_sql text) RETURNS text
LANGUAGE plpgsql AS $$
DECLARE v_plan text;
BEGIN
    EXECUTE 'EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) ' || p_sql INTO v_plan;
    RETURN v_plan;
END
$$";

#[derive(QueryableByName)]
struct PlanText {
    #[diesel(sql_type = Text)]
    plan: String,
}

/// `EXPLAIN (ANALYZE, BUFFERS)` of one lookup: with a custom and with the
/// generic plan (PL/pgSQL settles on the generic plan after a few calls)
/// under the settings its function runs with, and the generic plan under the
/// session's defaults (does the plan depend on those settings?). Each run is
/// rolled back (the group lookup takes a row lock). Also says whether the
/// statement still appears in the function's source, i.e. whether the copy
/// here is current.
pub(super) async fn explain(
    conn: &mut AsyncPgConnection,
    lookup: &Lookup,
    first_id: i64,
) -> Result<Value, String> {
    let err = |e: diesel::result::Error| e.to_string();
    let source: Dump = diesel::sql_query(
        "SELECT coalesce((SELECT pg_get_functiondef(to_regproc($1))), '') AS dump",
    )
    .bind::<Text, _>(lookup.function)
    .get_result(conn)
    .await
    .map_err(err)?;
    let in_source = squeeze(&source.dump).contains(&squeeze(lookup.sql));
    if !in_source {
        progress!(
            "warning: {} is no longer in {}'s source; the plan shown is of the copy in backlog.rs",
            lookup.label,
            lookup.function
        );
    }
    let names: Vec<&str> = lookup.params.iter().map(|p| p.0).collect();
    let types: Vec<&str> = lookup.params.iter().map(|p| p.1).collect();
    let first = first_id.to_string();
    let args: Vec<String> = lookup
        .params
        .iter()
        .map(|p| format!("{}::{}", p.2.replace("$FIRST", &first), p.1))
        .collect();
    conn.batch_execute(&format!(
        "PREPARE pgfifo_bench_explain({}) AS {}",
        types.join(", "),
        parameterize(lookup.sql, &names)
    ))
    .await
    .map_err(err)?;
    let mut out = serde_json::Map::new();
    let mut settings = serde_json::Map::new();
    for (label, mode, function_settings) in [
        ("custom", "force_custom_plan", true),
        ("generic", "force_generic_plan", true),
        ("generic_default_settings", "force_generic_plan", false),
    ] {
        conn.batch_execute(&format!("BEGIN; SET LOCAL plan_cache_mode = {mode}"))
            .await
            .map_err(err)?;
        let plan = async {
            if function_settings {
                diesel::sql_query(
                    "SELECT count(set_config(split_part(c, '=', 1), substr(c, strpos(c, '=') + 1), true)) AS n \
                     FROM pg_proc, unnest(proconfig) AS c WHERE oid = to_regproc($1)",
                )
                .bind::<Text, _>(lookup.function)
                .get_result::<Number>(conn)
                .await?;
            }
            diesel::sql_query("SELECT pg_temp.bench_explain($1) AS plan")
                .bind::<Text, _>(format!("EXECUTE pgfifo_bench_explain({})", args.join(", ")))
                .get_result::<PlanText>(conn)
                .await
        }
        .await;
        conn.batch_execute("ROLLBACK").await.map_err(err)?;
        let plan: Value =
            serde_json::from_str(&plan.map_err(err)?.plan).map_err(|e| e.to_string())?;
        if function_settings {
            settings.insert(label.to_owned(), summarize(&plan));
        } else {
            out.insert(label.to_owned(), summarize(&plan));
        }
    }
    conn.batch_execute("DEALLOCATE pgfifo_bench_explain")
        .await
        .map_err(err)?;
    out.insert("function_settings".to_owned(), Value::Object(settings));
    out.insert("function".to_owned(), json!(lookup.function));
    out.insert("copy_is_current".to_owned(), json!(in_source));
    Ok(Value::Object(out))
}

/// `text` with runs of whitespace made single spaces.
fn squeeze(text: &str) -> String {
    text.split_whitespace().collect::<Vec<_>>().join(" ")
}

/// A PL/pgSQL statement as a standalone one: its `INTO var` clause dropped
/// and its variables `names[i]` replaced by `$i+1` (whole identifiers only).
fn parameterize(sql: &str, names: &[&str]) -> String {
    let mut out = String::new();
    let mut words = sql.split_whitespace().peekable();
    while let Some(word) = words.next() {
        if word.eq_ignore_ascii_case("INTO") {
            words.next();
            continue;
        }
        let mut ident = String::new();
        for c in word.chars().chain(std::iter::once(' ')) {
            if c.is_ascii_alphanumeric() || c == '_' {
                ident.push(c);
                continue;
            }
            match names.iter().position(|n| *n == ident) {
                Some(i) => out.push_str(&format!("${}", i + 1)),
                None => out.push_str(&ident),
            }
            ident.clear();
            if c != ' ' {
                out.push(c);
            }
        }
        out.push(' ');
    }
    out.trim_end().to_owned()
}

/// The gist of an `EXPLAIN (FORMAT JSON)` result: the node chain from the top
/// (`Limit > LockRows > Index Scan using …`), the indexes used, whether the
/// plan is index-driven (an index scan, no sequential scan, no sort), timings
/// and buffers.
fn summarize(explain: &Value) -> Value {
    fn walk<'a>(node: &'a Value, nodes: &mut Vec<&'a Value>) {
        nodes.push(node);
        for child in node["Plans"].as_array().into_iter().flatten() {
            walk(child, nodes);
        }
    }
    fn label(node: &Value) -> String {
        let kind = node["Node Type"].as_str().unwrap_or("?");
        match node["Index Name"].as_str() {
            Some(index) => format!("{kind} using {index}"),
            None => kind.to_owned(),
        }
    }
    let top = &explain[0];
    let plan = &top["Plan"];
    let mut nodes = Vec::new();
    walk(plan, &mut nodes);
    let chain: Vec<String> = nodes.iter().map(|n| label(n)).collect();
    let indexes: Vec<&str> = nodes
        .iter()
        .filter_map(|n| n["Index Name"].as_str())
        .collect();
    let kinds: Vec<&str> = nodes
        .iter()
        .filter_map(|n| n["Node Type"].as_str())
        .collect();
    let index_driven = kinds.iter().any(|k| k.starts_with("Index"))
        && !kinds
            .iter()
            .any(|k| matches!(*k, "Seq Scan" | "Sort" | "Incremental Sort"));
    json!({
        "plan": chain.join(" > "),
        "top_node": plan["Node Type"],
        "index": nodes.iter().find_map(|n| n["Index Name"].as_str()),
        "indexes": indexes,
        "index_driven": index_driven,
        "execution_ms": top["Execution Time"],
        "planning_ms": top["Planning Time"],
        "shared_hit_blocks": plan["Shared Hit Blocks"],
        "shared_read_blocks": plan["Shared Read Blocks"],
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn statements_become_standalone() {
        assert_eq!(
            parameterize(LOOKUPS[1].sql, &["v_q", "v_prio", "v_lo", "v_hi", "v_now"]),
            "SELECT g.group_id FROM pgfifo.queue_group AS g WHERE g.queue = $1 AND g.ready_at IS NOT NULL \
             AND g.priority = $2 AND g.slot BETWEEN $3 AND $4 AND g.ready_at <= $5 ORDER BY g.slot"
        );
        assert_eq!(
            parameterize("SELECT f(v_a,v_ab) INTO x FROM t", &["v_a"]),
            "SELECT f($1,v_ab) FROM t"
        );
    }

    #[test]
    fn plans_summarize() {
        let plan = json!([{"Plan": {"Node Type": "Limit", "Shared Hit Blocks": 3, "Plans": [
            {"Node Type": "LockRows", "Plans": [
                {"Node Type": "Index Scan", "Index Name": "queue_group_ready_idx"}]}]},
            "Execution Time": 0.05, "Planning Time": 0.1}]);
        let s = summarize(&plan);
        assert_eq!(
            s["plan"],
            "Limit > LockRows > Index Scan using queue_group_ready_idx"
        );
        assert_eq!(s["index"], "queue_group_ready_idx");
        assert_eq!(s["index_driven"], true);
        let seq = json!([{"Plan": {"Node Type": "Limit", "Plans": [{"Node Type": "Sort", "Plans": [
            {"Node Type": "Seq Scan"}]}]}}]);
        assert_eq!(summarize(&seq)["index_driven"], false);
    }
}
