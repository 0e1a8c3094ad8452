use clap::Parser;
use conlock::error::exit;

fn main() {
    if holds_a_claim(std::env::args_os().skip(1)) {
        // Before anything starts a thread: see guardian.rs.
        conlock::hold::guardian::prefork();
    }
    let cli = match conlock::cli::Cli::try_parse() {
        Ok(cli) => cli,
        Err(e) if e.use_stderr() => {
            conlock::ui::error(usage_error_line(&e.render().to_string()));
            std::process::exit(exit::INTERNAL);
        }
        Err(e) => {
            // --help and --version.
            let _ = e.print();
            std::process::exit(0);
        }
    };
    let code = match conlock::app::run(cli) {
        Ok(code) => code,
        Err(e) => {
            conlock::ui::error(&e);
            e.exit_code()
        }
    };
    conlock::events::flush();
    conlock::ui::flush();
    std::process::exit(code);
}

/// Whether the arguments may name `run` or `sem` (those start a guardian). A false
/// positive costs one fork; the guardian then exits when conlock does.
fn holds_a_claim(args: impl Iterator<Item = std::ffi::OsString>) -> bool {
    args.take_while(|a| a != "--")
        .any(|a| a == "run" || a == "sem")
}

/// clap's message without its usage block, folded onto one line.
fn usage_error_line(rendered: &str) -> String {
    let message = rendered.split("\n\nUsage:").next().unwrap_or(rendered);
    let message = message
        .split("\n\nFor more information")
        .next()
        .unwrap_or(message);
    let message = message.trim().trim_start_matches("error:").trim();
    let mut folded = message.split_whitespace().collect::<Vec<_>>().join(" ");
    // clap's tip "to pass '-5' as a value, use '-- -5'" is wrong here: `--` starts the
    // command, so the value would become part of it.
    if let Some(at) = folded.find(" tip: to pass '") {
        let value = folded[at + 15..]
            .split('\'')
            .next()
            .unwrap_or("")
            .to_string();
        folded.truncate(at);
        folded.push_str(&format!(
            "; to give {value:?} as an option's value, attach it: --option={value}"
        ));
    }
    format!("{folded} (see 'conlock --help')")
}

#[cfg(test)]
mod tests {
    use super::holds_a_claim;

    fn args(s: &str) -> impl Iterator<Item = std::ffi::OsString> + '_ {
        s.split_whitespace().map(Into::into)
    }

    #[test]
    fn run_and_sem_are_recognized_wherever_the_global_flags_are() {
        assert!(holds_a_claim(args("run --key k -- true")));
        assert!(holds_a_claim(args(
            "-v --http-addr h:1 sem --prefix p -- x"
        )));
        assert!(!holds_a_claim(args("status --key k")));
        assert!(!holds_a_claim(args("watch --key k -- run")));
    }
}
