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
        Err(e) => {
            let code = if e.use_stderr() { exit::INTERNAL } else { 0 };
            let _ = e.print();
            std::process::exit(code);
        }
    };
    let code = match conlock::app::run(cli) {
        Ok(code) => code,
        Err(e) => {
            conlock::ui::error(&e);
            e.exit_code()
        }
    };
    std::process::exit(code);
}
