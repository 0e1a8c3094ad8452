use clap::Parser;
use conlock::error::exit;

fn main() {
    if std::env::args_os()
        .nth(1)
        .is_some_and(|a| a == conlock::guardian::GUARDIAN_ARG)
    {
        std::process::exit(conlock::guardian::main());
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
    conlock::ui::flush();
    std::process::exit(code);
}

/// clap's message without its usage block, folded onto one line.
fn usage_error_line(rendered: &str) -> String {
    let message = rendered.split("\n\nUsage:").next().unwrap_or(rendered);
    let message = message
        .split("\n\nFor more information")
        .next()
        .unwrap_or(message);
    let message = message.trim().trim_start_matches("error:").trim();
    let folded = message.split_whitespace().collect::<Vec<_>>().join(" ");
    format!("{folded} (see 'conlock --help')")
}
