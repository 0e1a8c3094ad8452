//! `conlock man [SUBCOMMAND]`: clap_mangen's title, synopsis and options, then the help's
//! closing text under the headings man readers look for (EXAMPLES, EXIT STATUS,
//! ENVIRONMENT), and SEE ALSO naming only pages and files that are installed.

use crate::cli::Cli;
use crate::error::{Error, Result};

/// The subcommands that have a page of their own (conlock-NAME.1).
pub const PAGES: [&str; 6] = ["run", "sem", "status", "watch", "break", "dev-server"];

/// Where the .deb puts the documentation (`make install`: PREFIX/share/doc/conlock).
pub const DOC_DIR: &str = "/usr/share/doc/conlock";

/// The roff page of conlock (None) or of one subcommand.
pub fn page(subcommand: Option<&str>) -> Result<Vec<u8>> {
    let mut top = <Cli as clap::CommandFactory>::command();
    // Subcommands are deferred (cli.rs): build them for their arguments and version.
    top.build();
    let cmd = match subcommand {
        None => top,
        Some(name) if PAGES.contains(&name) => top
            .find_subcommand(name)
            .cloned()
            .ok_or_else(|| Error::Usage(format!("no subcommand {name:?}")))?
            .name(format!("conlock-{name}"))
            // The synopsis shows how it is typed.
            .bin_name(format!("conlock {name}")),
        Some(name) => return Err(Error::Usage(format!("no man page for {name:?}"))),
    };
    let man = clap_mangen::Man::new(cmd.clone());
    let mut out = Vec::new();
    let io = |e: std::io::Error| Error::Other(e.into());
    man.render_title(&mut out).map_err(io)?;
    man.render_name_section(&mut out).map_err(io)?;
    man.render_synopsis_section(&mut out).map_err(io)?;
    man.render_description_section(&mut out).map_err(io)?;
    if cmd.get_arguments().any(|a| !a.is_hide_set()) {
        man.render_options_section(&mut out).map_err(io)?;
    }
    let mut text = String::new();
    if subcommand.is_none() {
        text.push_str(&subcommands(&cmd));
    }
    let closing = cmd
        .get_after_long_help()
        .or_else(|| cmd.get_after_help())
        .map(|s| s.to_string())
        .unwrap_or_default();
    for (heading, body) in sections(&closing)? {
        text.push_str(&format!(".SH {heading}\n"));
        text.push_str(&verbatim(&body));
    }
    text.push_str(&see_also(subcommand));
    out.extend_from_slice(text.as_bytes());
    if cmd.get_version().is_some() {
        man.render_version_section(&mut out).map_err(io)?;
    }
    Ok(out)
}

/// The top page's list: a page reference where one exists, the usage otherwise (clap's
/// own list names conlock-completions(1), conlock-man(1) and conlock-help(1)).
fn subcommands(cmd: &clap::Command) -> String {
    let mut s = String::from(".SH SUBCOMMANDS\n");
    for sub in cmd.get_subcommands().filter(|c| !c.is_hide_set()) {
        let name = sub.get_name();
        let label = if PAGES.contains(&name) {
            format!("\\fBconlock\\-{}\\fR(1)", escape(name))
        } else if name == "help" {
            continue;
        } else {
            let usage: Vec<String> = sub
                .get_positionals()
                .map(|a| {
                    let v = a
                        .get_value_names()
                        .and_then(|v| v.first())
                        .map(|v| v.to_string())
                        .unwrap_or_else(|| a.get_id().to_string().to_uppercase());
                    if a.is_required_set() {
                        v
                    } else {
                        format!("[{v}]")
                    }
                })
                .collect();
            format!(
                "\\fBconlock {}\\fR {}",
                escape(name),
                escape(&usage.join(" "))
            )
        };
        s.push_str(&format!(".TP\n{}\n", label.trim_end()));
        if let Some(about) = sub.get_about() {
            s.push_str(&format!("{}\n", escape(&about.to_string())));
        }
    }
    s
}

/// Splits the help's closing text (blocks separated by a blank line) into man sections,
/// in a fixed order; a block with an unknown lead line is an error, so nothing falls
/// into a catch-all section.
fn sections(closing: &str) -> Result<Vec<(&'static str, String)>> {
    const ORDER: [&str; 4] = ["EXAMPLES", "EXIT STATUS", "ENVIRONMENT", "JSON OUTPUT"];
    let mut found: Vec<(&'static str, String)> = Vec::new();
    for block in closing.split("\n\n").filter(|b| !b.trim().is_empty()) {
        let (first, rest) = block.split_once('\n').unwrap_or((block, ""));
        let (heading, body) = if first == "Examples:" {
            ("EXAMPLES", rest.to_string())
        } else if first == "Exit codes:" {
            ("EXIT STATUS", rest.to_string())
        } else if first.starts_with("Environment") || first.starts_with("The command gets") {
            ("ENVIRONMENT", block.to_string())
        } else if first.starts_with("JSON:") {
            ("JSON OUTPUT", block.to_string())
        } else {
            return Err(Error::Other(anyhow::anyhow!(
                "man page: no section for the help text starting {first:?} (src/app/man.rs)"
            )));
        };
        match found.iter_mut().find(|(h, _)| *h == heading) {
            Some((_, b)) => b.push_str(&format!("\n\n{body}")),
            None => found.push((heading, body)),
        }
    }
    found.sort_by_key(|(h, _)| ORDER.iter().position(|o| o == h));
    Ok(found)
}

fn see_also(subcommand: Option<&str>) -> String {
    let refs: Vec<String> = match subcommand {
        None => PAGES.iter().map(|p| format!("conlock-{p}(1)")).collect(),
        Some(_) => vec!["conlock(1)".into()],
    };
    let mut files = vec!["README.md", "docs/guide.md", "docs/safety.md"];
    match subcommand {
        Some("run" | "sem") | None => {
            files.extend(["docs/events.md", "docs/events.schema.json"]);
        }
        Some("status") => files.push("docs/status.schema.json"),
        Some("dev-server") => files = vec!["docs/dev-server.md"],
        _ => {}
    }
    let mut s = String::from(".SH SEE ALSO\n");
    s.push_str(&escape(&refs.join(", ")));
    s.push_str("\n.PP\nIn ");
    s.push_str(&escape(DOC_DIR));
    s.push_str(
        " (the Debian package; \\fBmake install\\fR: PREFIX/share/doc/conlock, \
         /usr/local by default):\n.nf\n",
    );
    for f in files {
        s.push_str(&format!("  {}\n", escape(&format!("{DOC_DIR}/{f}"))));
    }
    s.push_str(".fi\n");
    s
}

/// Lines as written (examples and tables keep their layout).
fn verbatim(body: &str) -> String {
    let mut s = String::from(".nf\n");
    for line in body.lines() {
        s.push_str(&escape(line));
        s.push('\n');
    }
    s.push_str(".fi\n");
    s
}

/// roff escapes as clap_mangen writes them; a leading dot or quote is not a request.
fn escape(text: &str) -> String {
    let mut s = String::with_capacity(text.len());
    for c in text.chars() {
        match c {
            '\\' => s.push_str("\\e"),
            '-' => s.push_str("\\-"),
            '\'' => s.push_str("\\*(Aq"),
            _ => s.push(c),
        }
    }
    if s.starts_with('.') {
        s.insert_str(0, "\\&");
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_page_puts_the_closing_text_under_known_headings() {
        for sub in std::iter::once(None).chain(PAGES.iter().map(|p| Some(*p))) {
            let roff = String::from_utf8(page(sub).unwrap()).unwrap();
            assert!(!roff.contains(".SH EXTRA"), "{sub:?}");
            assert!(roff.contains(".SH SEE ALSO"), "{sub:?}");
            if !matches!(sub, Some("dev-server" | "watch")) {
                assert!(roff.contains(".SH EXIT STATUS"), "{sub:?}");
            }
        }
    }

    #[test]
    fn escape_keeps_a_leading_dot_literal() {
        assert_eq!(escape(".x-y"), "\\&.x\\-y");
        assert_eq!(escape("a\\b'c"), "a\\eb\\*(Aqc");
    }
}
