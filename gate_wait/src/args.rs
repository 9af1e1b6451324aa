//! The command line: `gatewrap-wait --pid PID --control-fd FD [--timeout SECONDS] [--cgroup DIR]`.

use std::ffi::{CString, OsString};
use std::os::unix::ffi::OsStringExt;
use std::time::Duration;

pub const USAGE: &str = "\
usage: gatewrap-wait --pid PID --control-fd FD [--timeout SECONDS] [--cgroup DIR]
                     [--socket PATH --run RUN_ID]
       gatewrap-wait --init -- PROGRAM [ARG...]

The agent's parent in gatewrap's shared mode (the client exec()s it after spawning the agent).
Waits for PID (a child of this process), forwarding SIGINT, SIGTERM, SIGHUP and SIGQUIT to the
jail's init and reaping every orphan (the process is a subreaper), then writes `exit CODE` to
the control socket FD (the gatewrap daemon), copies the daemon's answer to stderr and exits
with CODE: the agent's exit code, or 128 + signal.

  --pid PID            the agent's process (the jail's init or the agent itself): a child of this process
  --control-fd FD      a connected unix stream socket to the gatewrap daemon
  --timeout SECONDS    kill the agent's cgroup after SECONDS (decimals allowed): exit code 124
  --cgroup DIR         the run's cgroup v2 directory (needed with --timeout): DIR/cgroup.kill
  --socket PATH        the daemon's socket: when the daemon dies, try it every 0.5 s and ask a
  --run RUN_ID         restarted daemon to take run RUN_ID back (`resume RUN_ID`)
  -h, --help           this text

With --init it is the jail's init instead (pid 1 of the run's pid namespace, as tini): it
runs PROGRAM, forwards to it every signal it gets, reaps every orphan and exits with PROGRAM's
code (127: not found, 126: not executable).

Exit codes: the agent's; 124 after --timeout; 125 when the waiter itself fails.
";

/// With `--init --` first in `args` (those after the program name): the rest (the agent's
/// command line), else `None`.
pub fn init_command(args: &[OsString]) -> Option<Vec<OsString>> {
    match args {
        [init, dashes, rest @ ..] if init == "--init" && dashes == "--" => Some(rest.to_vec()),
        _ => None,
    }
}

/// What the waiter was asked to do.
#[derive(Debug, PartialEq)]
pub struct Config {
    /// The agent's pid (a child of this process).
    pub pid: libc::pid_t,
    /// The control socket's fd (inherited: FD_CLOEXEC cleared by the client).
    pub control_fd: libc::c_int,
    /// After this long the cgroup is killed (`None`: no limit).
    pub timeout: Option<Duration>,
    /// `DIR/cgroup.kill`, when `--cgroup DIR` was given.
    pub cgroup_kill: Option<CString>,
    /// Where to ask a restarted daemon to take the run back (`--socket` and `--run`).
    pub resume: Option<crate::resume::Resume>,
}

/// The parsed command line.
#[derive(Debug, PartialEq)]
pub enum Parsed {
    Help,
    Run(Config),
}

/// Parse the arguments after the program name. `Err` is the message for stderr (exit 125).
pub fn parse(args: impl IntoIterator<Item = OsString>) -> Result<Parsed, String> {
    let mut pid = None;
    let mut control_fd = None;
    let mut timeout = None;
    let mut cgroup: Option<OsString> = None;
    let mut socket: Option<OsString> = None;
    let mut run: Option<OsString> = None;
    let args: Vec<OsString> = args.into_iter().collect();
    if args.iter().any(|a| a == "-h" || a == "--help") {
        return Ok(Parsed::Help);
    }
    let mut args = args.into_iter();
    while let Some(arg) = args.next() {
        let arg = arg.into_string().map_err(|a| format!("unknown argument {a:?}"))?;
        // --flag VALUE or --flag=VALUE
        let (flag, inline) = match arg.split_once('=') {
            Some((f, v)) if f.starts_with("--") => (f.to_owned(), Some(OsString::from(v))),
            _ => (arg, None),
        };
        let mut value = || -> Result<OsString, String> {
            inline.clone().or_else(|| args.next()).ok_or_else(|| format!("{flag} needs a value"))
        };
        match flag.as_str() {
            "--pid" => set(&mut pid, &flag, parse_pid(&text(value()?, &flag)?)?)?,
            "--control-fd" => set(&mut control_fd, &flag, parse_fd(&text(value()?, &flag)?)?)?,
            "--timeout" => set(&mut timeout, &flag, parse_seconds(&text(value()?, &flag)?)?)?,
            "--cgroup" => set(&mut cgroup, &flag, value()?)?,
            "--socket" => set(&mut socket, &flag, value()?)?,
            "--run" => set(&mut run, &flag, value()?)?,
            _ => return Err(format!("unknown argument {flag:?}")),
        }
    }
    let pid = pid.ok_or("--pid PID is required")?;
    let control_fd = control_fd.ok_or("--control-fd FD is required")?;
    if timeout.is_some() && cgroup.is_none() {
        return Err("--timeout needs --cgroup DIR (the run's cgroup, killed at the timeout)".into());
    }
    let cgroup_kill = match cgroup {
        None => None,
        Some(dir) => {
            let mut path = dir.into_vec();
            if path.is_empty() {
                return Err("--cgroup DIR is empty".into());
            }
            path.extend_from_slice(b"/cgroup.kill");
            Some(CString::new(path).map_err(|_| "--cgroup DIR contains a NUL byte".to_owned())?)
        }
    };
    let resume = match (socket, run) {
        (None, None) => None,
        (Some(socket), Some(run)) => {
            let run = run.into_string().map_err(|r| format!("--run {r:?}: not a run id"))?;
            if run.is_empty() || !run.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-') {
                return Err(format!("--run {run:?}: not a run id (gw- and hex digits)"));
            }
            Some(crate::resume::Resume { socket: socket.into(), run })
        }
        _ => return Err("--socket and --run go together".into()),
    };
    Ok(Parsed::Run(Config { pid, control_fd, timeout, cgroup_kill, resume }))
}

fn set<T>(slot: &mut Option<T>, flag: &str, value: T) -> Result<(), String> {
    if slot.replace(value).is_some() {
        return Err(format!("{flag} given twice"));
    }
    Ok(())
}

fn text(value: OsString, flag: &str) -> Result<String, String> {
    value.into_string().map_err(|v| format!("{flag} {v:?}: not a number"))
}

fn parse_pid(text: &str) -> Result<libc::pid_t, String> {
    match text.parse::<libc::pid_t>() {
        Ok(pid) if pid > 0 => Ok(pid),
        _ => Err(format!("--pid {text:?}: not a process id (a positive integer)")),
    }
}

fn parse_fd(text: &str) -> Result<libc::c_int, String> {
    match text.parse::<libc::c_int>() {
        Ok(fd) if fd >= 0 => Ok(fd),
        _ => Err(format!("--control-fd {text:?}: not a file descriptor (an integer >= 0)")),
    }
}

fn parse_seconds(text: &str) -> Result<Duration, String> {
    let bad = || format!("--timeout {text:?}: not a number of seconds >= 0");
    // f64's parser also takes "inf" and "nan": Duration refuses both (and negatives).
    let secs: f64 = text.trim().parse().map_err(|_| bad())?;
    Duration::try_from_secs_f64(secs).map_err(|_| bad())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(args: &[&str]) -> Result<Parsed, String> {
        parse(args.iter().map(OsString::from))
    }

    #[test]
    fn a_full_command_line_is_parsed_in_either_spelling() {
        let want = Parsed::Run(Config {
            pid: 42,
            control_fd: 3,
            timeout: Some(Duration::from_millis(500)),
            cgroup_kill: Some(CString::new("/sys/fs/cgroup/gatewrap/gw-1/cgroup.kill").unwrap()),
            resume: None,
        });
        let spaced = ["--pid", "42", "--control-fd", "3", "--timeout", "0.5", "--cgroup", "/sys/fs/cgroup/gatewrap/gw-1"];
        assert_eq!(run(&spaced), Ok(want));
        let joined = run(&["--pid=42", "--control-fd=3", "--timeout=0.5", "--cgroup=/sys/fs/cgroup/gatewrap/gw-1"]);
        assert!(matches!(joined, Ok(Parsed::Run(Config { pid: 42, control_fd: 3, .. }))));
    }

    #[test]
    fn bad_command_lines_are_refused_with_a_reason() {
        let cases: &[(&str, &[&str], &str)] = &[
            ("no pid", &["--control-fd", "3"], "--pid PID is required"),
            ("no control fd", &["--pid", "4"], "--control-fd FD is required"),
            ("a pid that is no number", &["--pid", "x", "--control-fd", "3"], "not a process id"),
            ("pid zero", &["--pid", "0", "--control-fd", "3"], "not a process id"),
            ("a negative fd", &["--pid", "4", "--control-fd", "-1"], "not a file descriptor"),
            ("a negative timeout", &["--pid", "4", "--control-fd", "3", "--timeout", "-1", "--cgroup", "/c"], "not a number of seconds"),
            ("an infinite timeout", &["--pid", "4", "--control-fd", "3", "--timeout", "inf", "--cgroup", "/c"], "not a number of seconds"),
            ("a timeout without a cgroup", &["--pid", "4", "--control-fd", "3", "--timeout", "1"], "--timeout needs --cgroup"),
            ("a flag without its value", &["--pid"], "--pid needs a value"),
            ("a flag given twice", &["--pid", "4", "--pid", "5"], "--pid given twice"),
            ("an unknown flag", &["--pid", "4", "--control-fd", "3", "--verbose"], "unknown argument \"--verbose\""),
            ("a socket without a run", &["--pid", "4", "--control-fd", "3", "--socket", "/run/gatewrap/d.sock"], "go together"),
            ("a run id with a newline", &["--pid", "4", "--control-fd", "3", "--socket", "/s", "--run", "gw-1\nexit 0"], "not a run id"),
        ];
        for (case, args, reason) in cases {
            let got = run(args).expect_err(case);
            assert!(got.contains(reason), "{case}: {got:?} does not say {reason:?}");
        }
    }

    #[test]
    fn init_takes_everything_after_its_double_dash_as_the_agents_command() {
        let args = |a: &[&str]| a.iter().map(OsString::from).collect::<Vec<_>>();
        assert_eq!(init_command(&args(&["--init", "--", "sh", "--pid", "-c"])), Some(args(&["sh", "--pid", "-c"])));
        assert_eq!(init_command(&args(&["--init", "sh"])), None);
        assert_eq!(init_command(&args(&["--pid", "4", "--init", "--", "sh"])), None);
    }

    #[test]
    fn help_wins_over_everything_else() {
        assert_eq!(run(&["--pid", "x", "--help"]), Ok(Parsed::Help));
    }
}
