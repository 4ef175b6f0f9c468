//! dcgm-exporter's command-line syntax (urfave/cli on Go's `flag` package) on top of clap.
//!
//! What Go accepts and clap does not by itself:
//! - a bool flag takes `--flag`, `--flag=true` and `--flag=false` (also `-k=false`);
//! - values of bool flags and bool environment variables are what `strconv.ParseBool` takes;
//! - a long flag may be written with one dash (`-rbmn`, `-kubernetes=true`), a short one with
//!   two (`--c=5000`, `--a :9400`);
//! - an empty file flag (`--config-file=`, `--web-config-file=`) is no file, as Go's `""`;
//! - an environment variable set to the empty string counts as unset;
//! - an unusable environment variable is reported by its name.
//!
//! [`parse`] applies these rules to [`Args`] and records which settings were given explicitly
//! (flag or environment), so a `--config-file` fills in only the rest.

use std::ffi::{OsStr, OsString};

use clap::{ArgAction, CommandFactory, FromArgMatches};

use super::Args;

mod values;

pub use values::{file_path, format_duration, parse_bool, parse_duration, Explicit, GO_BOOLS};

/// An environment variable whose value the flag cannot take.
#[derive(Debug, thiserror::Error)]
#[error("environment variable {var}={value:?} (for --{flag}): {reason}")]
pub struct EnvError {
    /// The variable.
    pub var: String,
    /// Its value.
    pub value: String,
    /// The flag it sets.
    pub flag: String,
    /// Why the value is unusable.
    pub reason: String,
}

/// Why the command line could not be parsed.
#[derive(Debug, thiserror::Error)]
pub enum CliError {
    /// clap's own error (unknown flag, bad value, `--help`, `--version`).
    #[error("{0}")]
    Clap(#[from] clap::Error),
    /// An environment variable is unusable.
    #[error(transparent)]
    Env(#[from] EnvError),
}

/// [`Args`]' command with Go's syntax: bool flags take an optional `=VALUE` parsed by
/// [`parse_bool`], and environment variables that `env` reports empty are ignored.
pub fn command(env: &dyn Fn(&OsStr) -> Option<OsString>) -> clap::Command {
    // Go's flag package lets a repeated flag override the earlier one.
    Args::command().args_override_self(true).mut_args(|arg| {
        let empty_env = arg
            .get_env()
            .is_some_and(|name| env(name).is_some_and(|v| v.is_empty()));
        let arg = if empty_env {
            arg.env(None::<&'static str>)
        } else {
            arg
        };
        if matches!(arg.get_action(), ArgAction::SetTrue) {
            arg.action(ArgAction::Set)
                .num_args(0..=1)
                .require_equals(true)
                .default_missing_value("true")
                .default_value("false")
                .value_parser(parse_bool)
        } else {
            arg
        }
    })
}

/// Rewrites Go's single-dash long flags (`-rbmn`, `-kubernetes=false`) to two dashes, and
/// double-dash short ones (`--c=5000`, `--a :9400`: Go's `flag` takes either) to one. A token
/// that is the value of the flag before it is left alone.
pub fn normalise_argv(cmd: &clap::Command, argv: Vec<OsString>) -> Vec<OsString> {
    let takes_value = |name: &str, inline_value: bool| {
        cmd.get_arguments()
            .find(|a| {
                a.get_long() == Some(name)
                    || a.get_all_aliases().is_some_and(|al| al.contains(&name))
                    || (name.len() == 1 && a.get_short().map(String::from).as_deref() == Some(name))
            })
            .is_some_and(|a| {
                !inline_value && a.get_action().takes_values() && !a.is_require_equals_set()
            })
    };
    let is_long = |name: &str| {
        cmd.get_arguments().any(|a| {
            a.get_long() == Some(name) || a.get_all_aliases().is_some_and(|al| al.contains(&name))
        })
    };
    let mut out = Vec::with_capacity(argv.len());
    let mut value_next = false;
    let mut rest_positional = false;
    for (i, token) in argv.into_iter().enumerate() {
        if i == 0 || rest_positional || std::mem::take(&mut value_next) {
            out.push(token);
            continue;
        }
        let Some(text) = token.to_str() else {
            out.push(token);
            continue;
        };
        if text == "--" {
            rest_positional = true;
            out.push(token);
            continue;
        }
        let (dashes, body) = if let Some(b) = text.strip_prefix("--") {
            (2, b)
        } else if let Some(b) = text.strip_prefix('-') {
            (1, b)
        } else {
            out.push(token);
            continue;
        };
        let (name, inline) = match body.split_once('=') {
            Some((n, _)) => (n, true),
            None => (body, false),
        };
        value_next = takes_value(name, inline);
        let is_short = |name: &str| {
            let mut chars = name.chars();
            chars.next().is_some_and(|c| {
                chars.next().is_none() && cmd.get_arguments().any(|a| a.get_short() == Some(c))
            })
        };
        if dashes == 1 && name.len() > 1 && is_long(name) {
            out.push(OsString::from(format!("-{text}")));
        } else if dashes == 2 && is_short(name) && !is_long(name) {
            out.push(OsString::from(&text[1..]));
        } else {
            out.push(token);
        }
    }
    out
}

/// Checks every environment variable the command reads against its flag's value parser, so
/// an unusable value is reported by the variable's name (Go reports it even when the flag is
/// also given).
///
/// # Errors
/// [`EnvError`] for the first unusable variable.
pub fn check_env(
    cmd: &clap::Command,
    env: &dyn Fn(&OsStr) -> Option<OsString>,
) -> Result<(), EnvError> {
    for arg in cmd.get_arguments() {
        let Some(name) = arg.get_env() else { continue };
        let Some(value) = env(name).filter(|v| !v.is_empty()) else {
            continue;
        };
        let Some(long) = arg.get_long() else { continue };
        // The flag alone in a command of its own, given the variable's value: the same value
        // parser, range and delimiter as the real parse.
        let mut flag = OsString::from(format!("--{long}="));
        flag.push(&value);
        let alone = clap::Command::new("env-check")
            .no_binary_name(true)
            .arg(arg.clone().env(None::<&'static str>).required(false));
        if let Err(e) = alone.try_get_matches_from([flag]) {
            return Err(EnvError {
                var: name.to_string_lossy().into_owned(),
                value: value.to_string_lossy().into_owned(),
                flag: long.to_owned(),
                reason: clap_reason(&e),
            });
        }
    }
    Ok(())
}

/// The reason in a clap value error, without clap's `error:` prefix and usage lines.
fn clap_reason(e: &clap::Error) -> String {
    let text = e.to_string();
    let first = text.lines().next().unwrap_or_default();
    let first = first.strip_prefix("error: ").unwrap_or(first);
    // "invalid value 'x' for '--flag <FLAG>': reason" -> "reason" when there is one.
    match first.split_once("': ") {
        Some((_, reason)) if !reason.is_empty() => reason.to_owned(),
        _ => first.to_owned(),
    }
}

/// Parses `argv` (program name first) and the environment (`env`) with Go's syntax.
///
/// # Errors
/// [`CliError::Env`] naming an unusable environment variable, else clap's error (which also
/// carries `--help` and `--version`).
pub fn parse(
    argv: impl IntoIterator<Item = OsString>,
    env: &dyn Fn(&OsStr) -> Option<OsString>,
) -> Result<Args, CliError> {
    let mut cmd = command(env);
    cmd.build();
    let argv = normalise_argv(&cmd, argv.into_iter().collect());
    check_env(&cmd, env)?;
    let matches = cmd.try_get_matches_from_mut(argv)?;
    let mut args = Args::from_arg_matches(&matches)?;
    // Go's string flags default to "", which dcgm-exporter reads as "no file": an empty value
    // given explicitly is the same.
    for file in [&mut args.config_file, &mut args.web_config_file] {
        if file.as_ref().is_some_and(|p| p.as_os_str().is_empty()) {
            *file = None;
        }
    }
    for id in matches.ids() {
        match matches.value_source(id.as_str()) {
            Some(clap::parser::ValueSource::CommandLine) => args.explicit.insert(id.as_str(), None),
            Some(clap::parser::ValueSource::EnvVariable) => {
                let var = cmd
                    .get_arguments()
                    .find(|a| a.get_id() == id)
                    .and_then(clap::Arg::get_env)
                    .map(|v| v.to_string_lossy().into_owned());
                args.explicit.insert(id.as_str(), var.as_deref());
            }
            _ => {}
        }
    }
    Ok(args)
}

/// The process environment, for [`parse`].
pub fn process_env(name: &OsStr) -> Option<OsString> {
    std::env::var_os(name)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    fn no_env(_: &OsStr) -> Option<OsString> {
        None
    }

    fn go(args: &[&str]) -> Result<Args, CliError> {
        let mut v = vec![OsString::from("gpu-exporter")];
        v.extend(args.iter().map(OsString::from));
        parse(v, &no_env)
    }

    #[test]
    fn parse_bool_takes_exactly_what_go_takes() {
        for t in ["1", "t", "T", "TRUE", "true", "True"] {
            assert_eq!(parse_bool(t), Ok(true), "{t}");
        }
        for f in ["0", "f", "F", "FALSE", "false", "False"] {
            assert_eq!(parse_bool(f), Ok(false), "{f}");
        }
        for bad in ["yes", "no", "on", "tRUE", "", " true", "2"] {
            let e = parse_bool(bad).unwrap_err();
            assert!(e.contains("is not a boolean"), "{bad}: {e}");
        }
    }

    #[test]
    fn durations_format_back() {
        for s in ["30s", "1m30s", "2h", "250ms", "0s", "1h0m5s"] {
            let d = parse_duration(s).unwrap();
            assert_eq!(parse_duration(&format_duration(d)), Ok(d), "{s}");
        }
        assert_eq!(format_duration(Duration::from_secs(90)), "1m30s");
    }

    #[test]
    fn bool_flags_take_go_forms() {
        assert!(go(&["--kubernetes"]).unwrap().kubernetes);
        assert!(go(&["-k"]).unwrap().kubernetes);
        assert!(go(&["--kubernetes=true"]).unwrap().kubernetes);
        assert!(go(&["--kubernetes=1"]).unwrap().kubernetes);
        assert!(!go(&["--kubernetes=false"]).unwrap().kubernetes);
        assert!(!go(&["-k=false"]).unwrap().kubernetes);
        assert!(!go(&["--kubernetes=False"]).unwrap().kubernetes);
        assert!(!go(&[]).unwrap().kubernetes);
        assert!(go(&["-kubernetes=T"]).unwrap().kubernetes);
        // Repeated: the last one wins, as in Go.
        assert!(!go(&["-k", "--kubernetes=false"]).unwrap().kubernetes);
        assert_eq!(
            go(&["-c", "5000", "-c", "6000"]).unwrap().collect_interval,
            6000
        );
        // Lists append, as Go's string-slice flags do.
        let a = go(&[
            "--nvidia-resource-names",
            "a",
            "--nvidia-resource-names=b,c",
        ])
        .unwrap();
        assert_eq!(a.nvidia_resource_names, ["a", "b", "c"]);
        let e = go(&["--kubernetes=yes"]).unwrap_err().to_string();
        assert!(
            e.contains("--kubernetes") && e.contains("is not a boolean"),
            "{e}"
        );
    }

    #[test]
    fn single_dash_long_names_are_long_flags() {
        let a = go(&["-rbmn", "-collectors", "/x.csv", "-a=:1"]).unwrap();
        assert!(a.replace_blanks_in_model_name);
        assert_eq!(a.remote_hostengine_info, None);
        assert_eq!(
            a.collectors.as_deref(),
            Some(std::path::Path::new("/x.csv"))
        );
        assert_eq!(a.address, ":1");
        // A value that looks like a long flag stays a value (clap then decides about it).
        let cmd = command(&no_env);
        let argv = ["x", "--collectors", "-rbmn", "-rbmn", "-k=false", "-f"]
            .map(OsString::from)
            .to_vec();
        assert_eq!(
            normalise_argv(&cmd, argv),
            ["x", "--collectors", "-rbmn", "--rbmn", "-k=false", "-f"].map(OsString::from)
        );
    }

    #[test]
    fn short_flags_take_two_dashes_as_in_go() {
        let a = go(&[
            "--c=5000",
            "--a",
            "127.0.0.1:1",
            "--k",
            "--d=g:0",
            "--o=false",
        ])
        .unwrap();
        assert_eq!(a.collect_interval, 5000);
        assert_eq!(a.address, "127.0.0.1:1");
        assert!(a.kubernetes);
        assert_eq!(a.devices, "g:0");
        assert!(!a.use_old_namespace);
        assert!(a.explicit.contains("collect_interval"));
        // The value of a flag stays a value.
        let cmd = command(&no_env);
        let argv = ["x", "--collectors", "--c", "--c", "1000"]
            .map(OsString::from)
            .to_vec();
        assert_eq!(
            normalise_argv(&cmd, argv),
            ["x", "--collectors", "--c", "-c", "1000"].map(OsString::from)
        );
        // Not a short flag: clap's own error.
        assert!(go(&["--z=1"]).is_err());
    }

    #[test]
    fn an_empty_file_flag_is_no_file() {
        let a = go(&["--config-file=", "--web-config-file", ""]).unwrap();
        assert_eq!(a.config_file, None);
        assert_eq!(a.web_config_file, None);
        let a = go(&["--config-file=/c.yaml"]).unwrap();
        assert_eq!(
            a.config_file.as_deref(),
            Some(std::path::Path::new("/c.yaml"))
        );
    }

    #[test]
    fn explicit_settings_are_recorded() {
        let a = go(&["-k=false", "-c", "5000"]).unwrap();
        assert!(a.explicit.contains("kubernetes"));
        assert!(a.explicit.contains("collect_interval"));
        assert!(!a.explicit.contains("collectors"));
        assert!(!a.explicit.contains("debug"));
        assert_eq!(a.explicit.env_var("kubernetes"), None);
    }

    #[test]
    fn environment_is_checked_by_name_and_empty_is_unset() {
        let env = |name: &OsStr| match name.to_str() {
            Some("DCGM_EXPORTER_KUBERNETES") => Some(OsString::from("yes")),
            Some("DCGM_EXPORTER_INTERVAL") => Some(OsString::new()),
            _ => None,
        };
        let cmd = command(&env);
        let e = check_env(&cmd, &env).unwrap_err();
        assert_eq!(e.var, "DCGM_EXPORTER_KUBERNETES");
        assert_eq!(e.flag, "kubernetes");
        assert!(e.to_string().starts_with(
            "environment variable DCGM_EXPORTER_KUBERNETES=\"yes\" (for --kubernetes): \"yes\" is not a boolean"
        ), "{e}");
        let env = |name: &OsStr| match name.to_str() {
            Some("DCGM_EXPORTER_INTERVAL") => Some(OsString::from("fast")),
            _ => None,
        };
        let e = check_env(&command(&env), &env).unwrap_err();
        assert_eq!(e.var, "DCGM_EXPORTER_INTERVAL");
        // The empty variable's flag no longer reads it.
        let env = |name: &OsStr| (name == "DCGM_EXPORTER_INTERVAL").then(OsString::new);
        let cmd = command(&env);
        let interval = cmd
            .get_arguments()
            .find(|a| a.get_id() == "collect_interval")
            .unwrap();
        assert_eq!(interval.get_env(), None);
    }
}
