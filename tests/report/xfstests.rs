//! docs/xfstests.md, from the xfstests runs saved under docs/xfstests/ (one run's
//! summary.json each, with the daemon, the vfsd commit and the date added), the reasons in
//! docs/xfstests/reasons.tsv and the page's text in docs/xfstests/page.md, whose
//! @@COUNTS@@, @@DIFFERENCES@@, @@TABLE@@ and @@RUNS@@ are replaced by the generated parts.
//! Rewriting the page from unchanged data leaves it as it is.

use std::collections::{BTreeSet, HashMap};
use std::error::Error;
use std::path::{Path, PathBuf};

use serde_json::{Map, Value};
// The benchmark page's module, not a second copy: both pages are built into one binary.
use crate::benchmarks::show::{show, truthy};

pub type Result<T> = std::result::Result<T, Box<dyn Error>>;

const DAEMONS: [&str; 2] = ["vfsd", "virtiofsd"];

/// A run to save under docs/xfstests/ before the page is written; what is not given comes
/// from the run (the daemon from its `info`), HEAD (the commit) and the file's time (the
/// date).
#[derive(Default)]
pub struct Add {
    pub summary: PathBuf,
    pub daemon: Option<String>,
    pub commit: Option<String>,
    pub date: Option<String>,
    /// virtiofsd's version, which a virtiofsd run must have.
    pub version: Option<String>,
}

/// One saved run: its summary.json with the daemon, commit and date, and its file name.
struct Run {
    file: String,
    json: Map<String, Value>,
}

impl Run {
    fn get(&self, key: &str) -> &Value {
        self.json.get(key).unwrap_or(&Value::Null)
    }

    fn daemon(&self) -> &str {
        self.get("daemon").as_str().unwrap_or("")
    }

    /// A field as the page shows it: its text where it is set, else "".
    fn field(&self, key: &str) -> String {
        let v = self.get(key);
        if truthy(v) {
            show(v)
        } else {
            String::new()
        }
    }

    fn not_run_here(&self) -> &[Value] {
        let tests = &self.get("not_run_here")["tests"];
        tests.as_array().map_or(&[], Vec::as_slice)
    }

    fn tests(&self) -> &[Value] {
        self.get("tests").as_array().map_or(&[], Vec::as_slice)
    }
}

/// A test's result in one run.
struct Entry {
    status: String,
    seconds: Value,
    reason: Option<String>,
    /// Not run on the daemon because fstests refuses the file system type itself.
    not_run_here: bool,
}

impl Entry {
    fn from_json(t: &Value) -> Self {
        let reason = t.get("reason").filter(|r| truthy(r)).map(show);
        Entry {
            status: t.get("status").map_or(String::new(), show),
            seconds: t.get("seconds").cloned().unwrap_or(Value::Null),
            reason,
            not_run_here: false,
        }
    }

    fn cell(&self) -> String {
        if self.not_run_here {
            return "notrun (not run: same FSTYP check)".into();
        }
        let mut extra = vec![];
        if !self.seconds.is_null() {
            extra.push(format!("{}s", show(&self.seconds)));
        }
        // A converted run keeps a short note in 'reason' only where the page showed one.
        if let Some(reason) = &self.reason {
            if self.seconds.is_null() && self.status != "pass" {
                extra.push(reason.clone());
            }
        }
        if extra.is_empty() {
            self.status.clone()
        } else {
            format!("{} ({})", self.status, extra.join(", "))
        }
    }
}

fn load_runs(data: &Path) -> Result<Vec<Run>> {
    let mut names: Vec<String> = std::fs::read_dir(data)?
        .map(|e| Ok(e?.file_name().to_string_lossy().into_owned()))
        .collect::<std::io::Result<_>>()?;
    names.sort();
    let mut runs = vec![];
    for file in names.into_iter().filter(|n| n.ends_with(".json")) {
        let json = match serde_json::from_str(&std::fs::read_to_string(data.join(&file))?)? {
            Value::Object(m) => m,
            _ => return Err(format!("{file}: not a JSON object").into()),
        };
        let run = Run { file, json };
        if !DAEMONS.contains(&run.daemon()) {
            return Err(format!("{}: 'daemon' must be one of {DAEMONS:?}", run.file).into());
        }
        runs.push(run);
    }
    // Later runs give a test's row: by date, then file name.
    runs.sort_by_cached_key(|r| (r.field("date"), r.file.clone()));
    Ok(runs)
}

fn parse_reasons(tsv: &str) -> HashMap<String, String> {
    tsv.lines()
        .filter(|l| !l.is_empty() && !l.starts_with('#'))
        .map(|l| {
            let (test, why) = l.split_once('\t').unwrap_or((l, ""));
            (test.to_string(), why.to_string())
        })
        .collect()
}

/// test -> (its entry, the run it is from) for `daemon`, the latest run winning.
fn merge<'a>(runs: &'a [Run], daemon: &str) -> HashMap<String, (Entry, &'a Run)> {
    let mut rows = HashMap::new();
    for run in runs.iter().filter(|r| r.daemon() == daemon) {
        for t in run.not_run_here() {
            let entry = Entry {
                status: "notrun".into(),
                seconds: Value::Null,
                reason: None,
                not_run_here: true,
            };
            rows.insert(show(t), (entry, run));
        }
        for t in run.tests() {
            let name = t.get("test").map_or(String::new(), show);
            rows.insert(name, (Entry::from_json(t), run));
        }
    }
    rows
}

/// generic/9 before generic/10: the suite, then the number.
fn test_key(name: &str) -> (String, u64) {
    if let Some((suite, n)) = name.split_once('/') {
        let word = !suite.is_empty() && suite.chars().all(|c| c.is_alphanumeric() || c == '_');
        if word && !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit()) {
            if let Ok(n) = n.parse() {
                return (suite.to_string(), n);
            }
        }
    }
    (name.to_string(), 0)
}

fn version_label(runs: &[Run]) -> String {
    let versions: BTreeSet<String> = runs
        .iter()
        .filter(|r| r.daemon() == "virtiofsd")
        .map(|r| r.field("version"))
        .filter(|v| !v.is_empty())
        .collect();
    if versions.is_empty() {
        "virtiofsd".into()
    } else {
        format!(
            "virtiofsd {}",
            versions.into_iter().collect::<Vec<_>>().join("/")
        )
    }
}

/// "generic/004, 079 and 389": the suite named once.
fn short(tests: &[&String]) -> String {
    let nums: Vec<&str> = tests
        .iter()
        .map(|t| t.split_once('/').map_or(t.as_str(), |(_, n)| n))
        .collect();
    match nums.as_slice() {
        [] => "none".into(),
        [one] => format!("generic/{one}"),
        [init @ .., last] => format!("generic/{} and {last}", init.join(", ")),
    }
}

/// Greedy filling of lines up to `width` characters, breaking at spaces.
fn fill(text: &str, width: usize) -> String {
    let mut lines: Vec<String> = vec![];
    let mut line = String::new();
    for word in text.split_whitespace() {
        if line.is_empty() {
            line = word.to_string();
        } else if line.chars().count() + 1 + word.chars().count() <= width {
            line.push(' ');
            line += word;
        } else {
            lines.push(std::mem::replace(&mut line, word.to_string()));
        }
    }
    if !line.is_empty() {
        lines.push(line);
    }
    lines.join("\n")
}

/// The page's four generated parts: the counts per daemon, the differences between them,
/// the table of every test, and the table of runs.
fn render(runs: &[Run], reasons: &HashMap<String, String>) -> [String; 4] {
    let vfsd = merge(runs, "vfsd");
    let vd = merge(runs, "virtiofsd");
    let vd_label = version_label(runs);
    let mut names: Vec<&String> = vfsd
        .keys()
        .chain(vd.keys())
        .collect::<BTreeSet<_>>()
        .into_iter()
        .collect();
    names.sort_by_cached_key(|t| test_key(t));

    let counts = |rows: &HashMap<String, (Entry, &Run)>| {
        let mut c: HashMap<String, usize> = HashMap::new();
        for (e, _) in names.iter().filter_map(|t| rows.get(*t)) {
            *c.entry(e.status.clone()).or_default() += 1;
            *c.entry("here".into()).or_default() += usize::from(e.not_run_here);
        }
        move |k: &str| c.get(k).copied().unwrap_or(0)
    };
    let (cv, cd) = (counts(&vfsd), counts(&vd));
    let here = match cd("here") {
        0 => String::new(),
        n => format!(" ({n} of them by the same FSTYP check, not run on it)"),
    };
    let counts_md = [
        "| daemon | passed | failed | not run |".to_string(),
        "| --- | --- | --- | --- |".into(),
        format!(
            "| vfsd | {} | {} | {} |",
            cv("pass"),
            cv("fail"),
            cv("notrun")
        ),
        format!(
            "| {vd_label} | {} | {} | {}{here} |",
            cd("pass"),
            cd("fail"),
            cd("notrun")
        ),
    ]
    .join("\n");

    let status =
        |rows: &HashMap<String, (Entry, &Run)>, t: &str| rows.get(t).map(|(e, _)| e.status.clone());
    let is = |s: Option<String>, of: &[&str]| s.is_some_and(|s| of.contains(&s.as_str()));
    let only_vfsd_fails: Vec<&String> = names
        .iter()
        .copied()
        .filter(|t| is(status(&vfsd, t), &["fail"]) && is(status(&vd, t), &["pass"]))
        .collect();
    let only_vfsd_passes: Vec<&String> = names
        .iter()
        .copied()
        .filter(|t| is(status(&vfsd, t), &["pass"]) && is(status(&vd, t), &["fail", "notrun"]))
        .collect();
    let diff_md = fill(
        &format!(
            "Failing on vfsd and passing on {vd_label}: {}. Passing on vfsd and not on {vd_label}: {}.",
            short(&only_vfsd_fails),
            short(&only_vfsd_passes)
        ),
        90,
    );

    let mut table = vec![
        format!("| test | vfsd | vfsd commit | {vd_label} | reason (a test that did not pass) |"),
        "| --- | --- | --- | --- | --- |".into(),
    ];
    for t in &names {
        let (ev, ed) = (vfsd.get(*t), vd.get(*t));
        // reasons.tsv first, else the vfsd run's reason, else virtiofsd's.
        let why = reasons.get(*t).cloned().or_else(|| {
            [ev, ed].into_iter().flatten().find_map(|(e, _)| {
                e.reason
                    .clone()
                    .filter(|_| e.status != "pass" && !e.not_run_here)
            })
        });
        let cell = |e: Option<&(Entry, &Run)>| e.map_or("not run here".into(), |(e, _)| e.cell());
        let commit = ev.map_or(String::new(), |(_, run)| run.field("commit"));
        table.push(format!(
            "| {t} | {} | {commit} | {} | {} |",
            cell(ev),
            cell(ed),
            why.unwrap_or_default()
        ));
    }

    let mut runs_md = vec![
        "| file | daemon | vfsd commit | date | tests | passed | failed | not run |".to_string(),
        "| --- | --- | --- | --- | --- | --- | --- | --- |".into(),
    ];
    for r in runs {
        let version = r.field("version");
        let daemon = if version.is_empty() {
            r.daemon().to_string()
        } else {
            format!("{} {version}", r.daemon())
        };
        let n = r.tests().len() + r.not_run_here().len();
        let count = |k: &str| r.json.get(k).map_or(String::new(), show);
        runs_md.push(format!(
            "| [{f}](xfstests/{f}) | {daemon} | {} | {} | {n} | {} | {} | {} |",
            r.field("commit"),
            r.field("date"),
            count("passed"),
            count("failed"),
            count("not_run"),
            f = r.file,
        ));
    }
    [counts_md, diff_md, table.join("\n"), runs_md.join("\n")]
}

/// Rewrites docs/xfstests.md in the tree at `root` from docs/xfstests/.
pub fn write_page(root: &Path) -> Result<()> {
    let data = root.join("docs/xfstests");
    let mut page = std::fs::read_to_string(data.join("page.md"))?;
    let reasons = parse_reasons(&std::fs::read_to_string(data.join("reasons.tsv"))?);
    let parts = render(&load_runs(&data)?, &reasons);
    for (key, text) in ["@@COUNTS@@", "@@DIFFERENCES@@", "@@TABLE@@", "@@RUNS@@"]
        .iter()
        .zip(parts)
    {
        if !page.contains(key) {
            return Err(format!("docs/xfstests/page.md lacks {key}").into());
        }
        page = page.replace(key, &text);
    }
    std::fs::write(root.join("docs/xfstests.md"), page)?;
    Ok(())
}

/// Saves a run's summary.json under docs/xfstests/ with the daemon, commit and date (and
/// virtiofsd's version) first; returns the file's name.
pub fn add(root: &Path, a: &Add) -> Result<String> {
    let run = match serde_json::from_str(&std::fs::read_to_string(&a.summary)?)? {
        Value::Object(m) => m,
        _ => return Err(format!("{}: not a JSON object", a.summary.display()).into()),
    };
    let info: Vec<String> = run
        .get("info")
        .and_then(Value::as_array)
        .map_or(vec![], |v| v.iter().map(show).collect());
    let daemon = a.daemon.clone().or_else(|| daemon_of(&info.join("\n")));
    let daemon = match daemon {
        Some(d) if DAEMONS.contains(&d.as_str()) => d,
        other => {
            return Err(
                format!("say --daemon (one of {DAEMONS:?}); run.info gives {other:?}").into(),
            )
        }
    };
    let commit = match &a.commit {
        Some(c) => c.clone(),
        None => head_commit(root)?,
    };
    let date = match &a.date {
        Some(d) => d.clone(),
        None => utc_date(std::fs::metadata(&a.summary)?.modified()?),
    };
    let mut head = vec![
        ("daemon", Value::from(daemon.as_str())),
        ("commit", Value::from(commit.as_str())),
        ("date", Value::from(date)),
    ];
    let name = if daemon == "virtiofsd" {
        let Some(version) = &a.version else {
            return Err("say --version for a virtiofsd run (e.g. --version 1.14)".into());
        };
        head.push(("version", Value::from(version.as_str())));
        format!("{daemon}-{version}-{commit}.json")
    } else {
        format!("{daemon}-{commit}.json")
    };
    let mut fields: Vec<(&str, &Value)> = head.iter().map(|(k, v)| (*k, v)).collect();
    for (k, v) in &run {
        if !fields.iter().any(|(f, _)| f == k) {
            fields.push((k, v));
        }
    }
    std::fs::write(
        root.join("docs/xfstests").join(&name),
        pretty_object(&fields)? + "\n",
    )?;
    Ok(name)
}

/// The daemon a run's info names on a line `daemon: NAME` (maybe quoted).
fn daemon_of(info: &str) -> Option<String> {
    info.lines().find_map(|l| {
        let rest = l.strip_prefix("daemon: ")?;
        let rest = rest.strip_prefix('"').unwrap_or(rest);
        let word: String = rest
            .chars()
            .take_while(|c| c.is_alphanumeric() || *c == '_')
            .collect();
        (!word.is_empty()).then_some(word)
    })
}

fn head_commit(root: &Path) -> Result<String> {
    let out = std::process::Command::new("git")
        .arg("-C")
        .arg(root)
        .args(["rev-parse", "--short", "HEAD"])
        .output()?;
    if !out.status.success() {
        return Err(format!("git rev-parse: {}", String::from_utf8_lossy(&out.stderr)).into());
    }
    Ok(String::from_utf8_lossy(&out.stdout).trim().to_string())
}

/// YYYY-MM-DD of `t` in UTC.
fn utc_date(t: std::time::SystemTime) -> String {
    let secs = match t.duration_since(std::time::UNIX_EPOCH) {
        Ok(d) => d.as_secs() as i64,
        Err(e) => -(e.duration().as_secs() as i64),
    };
    // Days since 1970-01-01 to a civil date, in 400-year eras of 146,097 days.
    let z = secs.div_euclid(86_400) + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    format!("{year:04}-{month:02}-{day:02}")
}

/// A JSON object with its keys in the given order, indented by 2 and with non-ASCII
/// characters escaped, as the saved runs are written.
fn pretty_object(fields: &[(&str, &Value)]) -> Result<String> {
    let mut out = String::from("{\n");
    for (i, (k, v)) in fields.iter().enumerate() {
        let value = serde_json::to_string_pretty(v)?.replace('\n', "\n  ");
        out += &format!("  {}: {value}", serde_json::to_string(k)?);
        out += if i + 1 < fields.len() { ",\n" } else { "\n" };
    }
    out.push('}');
    let mut ascii = String::with_capacity(out.len());
    for c in out.chars() {
        if c.is_ascii() {
            ascii.push(c);
        } else {
            for unit in c.encode_utf16(&mut [0; 2]) {
                ascii += &format!("\\u{unit:04x}");
            }
        }
    }
    Ok(ascii)
}

#[cfg(test)]
mod tests {
    #[test]
    fn the_latest_run_gives_a_tests_row_and_the_reasons_file_comes_first() {
        use super::*;
        let run = |file: &str, json: &str| match serde_json::from_str(json).unwrap() {
            Value::Object(json) => Run {
                file: file.into(),
                json,
            },
            _ => unreachable!(),
        };
        let runs = [
            run(
                "vfsd-aaa.json",
                r#"{"daemon":"vfsd","commit":"aaa","date":"2026-01-01","passed":1,"failed":1,"not_run":0,
                    "tests":[{"test":"generic/10","status":"fail","seconds":null,"reason":"hung"},
                             {"test":"generic/2","status":"pass","seconds":3}]}"#,
            ),
            run(
                "vfsd-bbb.json",
                r#"{"daemon":"vfsd","commit":"bbb","date":"2026-01-02","passed":1,"failed":0,"not_run":0,
                    "tests":[{"test":"generic/10","status":"pass","seconds":7.5}]}"#,
            ),
            run(
                "virtiofsd-1.14.json",
                r#"{"daemon":"virtiofsd","version":"1.14","commit":"aaa","date":"2026-01-01",
                    "tests":[{"test":"generic/2","status":"fail","seconds":null,"reason":"EIO"},
                             {"test":"generic/10","status":"pass","seconds":4}],
                    "not_run_here":{"tests":["generic/9"]}}"#,
            ),
        ];
        let reasons = parse_reasons("# comment\ngeneric/9\tno FSTYP\n");
        let [counts, diff, table, runs_md] = render(&runs, &reasons);
        assert_eq!(
            counts,
            "| daemon | passed | failed | not run |\n| --- | --- | --- | --- |\n| vfsd | 2 | 0 | 0 |\n\
             | virtiofsd 1.14 | 1 | 1 | 1 (1 of them by the same FSTYP check, not run on it) |"
        );
        assert_eq!(
            diff,
            "Failing on vfsd and passing on virtiofsd 1.14: none. Passing on vfsd and not on \
             virtiofsd\n1.14: generic/2."
        );
        assert_eq!(
            table,
            "| test | vfsd | vfsd commit | virtiofsd 1.14 | reason (a test that did not pass) |\n\
             | --- | --- | --- | --- | --- |\n\
             | generic/2 | pass (3s) | aaa | fail (EIO) | EIO |\n\
             | generic/9 | not run here |  | notrun (not run: same FSTYP check) | no FSTYP |\n\
             | generic/10 | pass (7.5s) | bbb | pass (4s) |  |"
        );
        assert_eq!(
            runs_md.lines().nth(4).unwrap(),
            "| [virtiofsd-1.14.json](xfstests/virtiofsd-1.14.json) | virtiofsd 1.14 | aaa | 2026-01-01 | 3 |  |  |  |"
        );
    }

    #[test]
    fn tests_sort_by_number_and_the_differences_wrap_at_90() {
        use super::*;
        let mut names = vec!["generic/10", "other", "generic/9", "generic/100"];
        names.sort_by_key(|t| test_key(t));
        assert_eq!(names, ["generic/9", "generic/10", "generic/100", "other"]);
        let words = vec!["abcdefghi"; 20].join(" ");
        let filled = fill(&words, 90);
        assert!(filled.lines().all(|l| l.len() <= 90), "{filled}");
        assert_eq!(filled.lines().next().unwrap().len(), 89);
        assert_eq!(filled.replace('\n', " "), words);
    }

    #[test]
    fn an_added_run_is_saved_with_its_daemon_commit_and_date_first() {
        use super::*;
        let summary =
            r#"{"info":["daemon: \"virtiofsd\" --sandbox none","µs"],"passed":1,"tests":[]}"#;
        let page = "counts:\n@@COUNTS@@\n@@DIFFERENCES@@\n@@TABLE@@\n@@RUNS@@\n";
        let dir = crate::tree_with(&[
            ("summary.json", summary),
            ("docs/xfstests/page.md", page),
            ("docs/xfstests/reasons.tsv", "# none\n"),
        ]);
        let summary = dir.path().join("summary.json");
        let mut a = Add {
            summary,
            commit: Some("abc1234".into()),
            date: Some("2026-03-04".into()),
            ..Add::default()
        };
        let err = add(dir.path(), &a).unwrap_err().to_string();
        assert!(err.contains("--version"), "{err}");
        a.version = Some("1.14".into());
        assert_eq!(add(dir.path(), &a).unwrap(), "virtiofsd-1.14-abc1234.json");
        let saved =
            std::fs::read_to_string(dir.path().join("docs/xfstests/virtiofsd-1.14-abc1234.json"))
                .unwrap();
        assert_eq!(
            saved,
            "{\n  \"daemon\": \"virtiofsd\",\n  \"commit\": \"abc1234\",\n  \"date\": \"2026-03-04\",\n  \
             \"version\": \"1.14\",\n  \"info\": [\n    \"daemon: \\\"virtiofsd\\\" --sandbox none\",\n    \
             \"\\u00b5s\"\n  ],\n  \"passed\": 1,\n  \"tests\": []\n}\n"
        );
        write_page(dir.path()).unwrap();
        let md = std::fs::read_to_string(dir.path().join("docs/xfstests.md")).unwrap();
        assert!(md.starts_with("counts:\n| daemon | passed |"), "{md}");
        assert!(md.ends_with(
            "| [virtiofsd-1.14-abc1234.json](xfstests/virtiofsd-1.14-abc1234.json) | virtiofsd 1.14 \
             | abc1234 | 2026-03-04 | 0 | 1 |  |  |\n"
        ));
        // A page that lost a place for a generated part is not written over.
        std::fs::write(
            dir.path().join("docs/xfstests/page.md"),
            "@@COUNTS@@ @@TABLE@@",
        )
        .unwrap();
        let err = write_page(dir.path()).unwrap_err().to_string();
        assert!(err.contains("lacks @@DIFFERENCES@@"), "{err}");
    }

    #[test]
    fn dates_are_utc_days() {
        use super::*;
        let at = |secs| utc_date(std::time::UNIX_EPOCH + std::time::Duration::from_secs(secs));
        assert_eq!(at(0), "1970-01-01");
        assert_eq!(at(951_782_400), "2000-02-29");
        assert_eq!(at(1_767_225_599), "2025-12-31");
    }
}
