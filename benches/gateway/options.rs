//! Command-line flags of the harness. `cargo bench --bench gateway -- FLAGS`.

use std::time::Duration;

pub const USAGE: &str = "\
cargo bench --bench gateway -- [FLAGS]
  --quick              smoke run: short warm-up and runs, all doors and baselines
  --warmup SECS        warm-up before each measured run (default 1, quick 0.3)
  --duration SECS      measured time of each run (default 5, quick 1)
  --levels LIST        in-flight levels: C (C connections, one request each) or
                       NxD (N connections, D requests in flight on each);
                       default 1,16,64,4x16 (quick: 1,16,64)
  --client-threads N   threads driving the client connections (default 1)
  --doors LIST         only these doors/baselines (names as in the table, by prefix)
  --micro-secs SECS    time per micro-benchmark (default 1, quick 0.2)
  --no-micro           skip the micro-benchmarks
";

/// One load level: `conns` connections with `depth` requests in flight on each.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Level {
    pub conns: usize,
    pub depth: usize,
}

impl Level {
    pub fn in_flight(&self) -> usize {
        self.conns * self.depth
    }

    pub fn label(&self) -> String {
        if self.depth == 1 {
            format!("{}", self.conns)
        } else {
            format!("{} ({}x{})", self.in_flight(), self.conns, self.depth)
        }
    }

    fn parse(text: &str) -> Result<Level, String> {
        let number = |t: &str| {
            t.trim()
                .parse::<usize>()
                .ok()
                .filter(|n| (1..=4096).contains(n))
                .ok_or_else(|| format!("bad level {text:?}: counts are 1 to 4096"))
        };
        match text.split_once('x') {
            Some((n, d)) => Ok(Level {
                conns: number(n)?,
                depth: number(d)?,
            }),
            None => Ok(Level {
                conns: number(text)?,
                depth: 1,
            }),
        }
    }
}

#[derive(Debug, Clone)]
pub struct Options {
    pub quick: bool,
    pub warmup: Duration,
    pub duration: Duration,
    pub levels: Vec<Level>,
    pub client_threads: usize,
    pub doors: Vec<String>,
    pub micro: Duration,
    pub run_micro: bool,
}

impl Options {
    pub fn wants_door(&self, name: &str) -> bool {
        self.doors.is_empty() || self.doors.iter().any(|d| name.starts_with(d.as_str()))
    }
}

fn seconds(value: &str, flag: &str) -> Result<Duration, String> {
    value
        .parse::<f64>()
        .ok()
        .filter(|s| s.is_finite() && *s >= 0.0 && *s <= 3600.0)
        .map(Duration::from_secs_f64)
        .ok_or_else(|| format!("{flag}: {value:?} is not a number of seconds (0 to 3600)"))
}

pub fn parse(args: Vec<String>) -> Result<Options, String> {
    let quick = args.iter().any(|a| a == "--quick");
    let mut o = Options {
        quick,
        warmup: Duration::from_secs_f64(if quick { 0.3 } else { 1.0 }),
        duration: Duration::from_secs_f64(if quick { 1.0 } else { 5.0 }),
        levels: if quick {
            vec![Level::parse("1")?, Level::parse("16")?, Level::parse("64")?]
        } else {
            vec![
                Level::parse("1")?,
                Level::parse("16")?,
                Level::parse("64")?,
                Level::parse("4x16")?,
            ]
        },
        client_threads: 1,
        doors: Vec::new(),
        micro: Duration::from_secs_f64(if quick { 0.2 } else { 1.0 }),
        run_micro: true,
    };
    let mut it = args.into_iter();
    while let Some(arg) = it.next() {
        let (flag, inline) = match arg.split_once('=') {
            Some((f, v)) if f.starts_with("--") => (f.to_string(), Some(v.to_string())),
            _ => (arg.clone(), None),
        };
        let mut value = || {
            inline
                .clone()
                .or_else(|| it.next())
                .ok_or_else(|| format!("{flag} needs a value"))
        };
        match flag.as_str() {
            "--quick" => {}
            // cargo passes --bench to harness = false benches.
            "--bench" => {}
            "--warmup" => o.warmup = seconds(&value()?, "--warmup")?,
            "--duration" => o.duration = seconds(&value()?, "--duration")?,
            "--micro-secs" => o.micro = seconds(&value()?, "--micro-secs")?,
            "--levels" => {
                o.levels = value()?
                    .split(',')
                    .map(Level::parse)
                    .collect::<Result<_, _>>()?
            }
            "--client-threads" => {
                o.client_threads = value()?
                    .parse()
                    .ok()
                    .filter(|n| (1..=64).contains(n))
                    .ok_or("--client-threads: 1 to 64")?
            }
            "--doors" => o.doors = value()?.split(',').map(str::to_string).collect(),
            "--no-micro" => o.run_micro = false,
            "-h" | "--help" => return Err(USAGE.to_string()),
            other if other.starts_with('-') => {
                return Err(format!("unknown flag {other}\n{USAGE}"));
            }
            // A positional filter from `cargo bench NAME`: not used.
            _ => {}
        }
    }
    if o.duration.is_zero() {
        return Err("--duration must be more than 0".into());
    }
    Ok(o)
}
