//! The policy file's `[sandbox]` table: (case, input, expected paths or `FILE:LINE` error).

use super::file::from_toml;
use super::SandboxPath;

fn paths(list: &[SandboxPath]) -> Vec<(&str, usize)> {
    list.iter().map(|p| (p.path.as_str(), p.line)).collect()
}

#[test]
fn sandbox_paths_are_read_with_their_lines() {
    let text = "default = \"deny\"\n[sandbox]\nro_bind = [\n  \"/opt/tools\",\n  \"/srv/data\",\n]\nbind = [\"/srv/scratch\"]\n";
    let p = from_toml(text, "p.toml").expect("parses");
    assert_eq!(paths(&p.sandbox.ro_bind), vec![("/opt/tools", 4), ("/srv/data", 5)]);
    assert_eq!(paths(&p.sandbox.bind), vec![("/srv/scratch", 7)]);
    let none = from_toml("default = \"deny\"\n", "p.toml").expect("parses");
    assert!(none.sandbox.ro_bind.is_empty() && none.sandbox.bind.is_empty(), "no [sandbox]: nothing bound");
    let empty = from_toml("[sandbox]\n", "p.toml").expect("an empty [sandbox] parses");
    assert!(empty.sandbox.ro_bind.is_empty() && empty.sandbox.bind.is_empty() && empty.sandbox.env.is_empty());
}

#[test]
fn sandbox_env_entries_are_kept_as_written_with_their_lines() {
    // checked by gatewrap's Python side (cli/gatewrap/sandbox/environment.py), for --env too
    let p = from_toml("[sandbox]\nenv = [\n  \"OPENAI_API_KEY\",\n  \"LOG=a = b \",\n]\n", "p.toml").expect("parses");
    assert_eq!(paths(&p.sandbox.env), vec![("OPENAI_API_KEY", 3), ("LOG=a = b ", 4)]);
}

#[test]
fn unprotect_takes_relative_and_absolute_paths_with_their_lines() {
    let text = "[sandbox]\nbind = [\"/srv\"]\nunprotect = [\n  \".vscode\",\n  \"/srv/repo/.git/hooks\",\n]\n";
    let p = from_toml(text, "p.toml").expect("parses");
    assert_eq!(paths(&p.sandbox.unprotect), vec![(".vscode", 4), ("/srv/repo/.git/hooks", 5)]);
    assert!(from_toml("[sandbox]\n", "p.toml").expect("parses").sandbox.unprotect.is_empty(), "nothing unprotected by default");
}

#[test]
fn bad_sandbox_tables_name_the_line() {
    let table: &[(&str, &str, &str)] = &[
        ("an unknown key", "[sandbox]\nro_bind = []\nrw_bind = [\"/x\"]\n", "p.toml:3: unknown key `rw_bind`; did you mean `ro_bind`?"),
        ("a string, not a list", "[sandbox]\nbind = \"/srv\"\n", "p.toml:2: invalid type: string \"/srv\", expected a sequence"),
        ("a relative path", "[sandbox]\nro_bind = [\"/a\", \"tools\"]\n", "p.toml:2: invalid path \"tools\": expected an absolute path (starting with /)"),
        ("a home-relative path", "[sandbox]\n\nbind = [\"~/.cache\"]\n", "p.toml:3: invalid path \"~/.cache\": expected an absolute path (starting with /)"),
        ("a dot-dot component", "[sandbox]\nro_bind = [\"/opt/../root\"]\n", "p.toml:2: invalid path \"/opt/../root\": a path cannot have . or .. components; write it out"),
        ("the root", "[sandbox]\nro_bind = [\"//\"]\n", "p.toml:2: invalid path \"//\": binding / would show the whole host (its sockets and secrets too); name the folders the agent needs"),
        ("a number in the list", "[sandbox]\nro_bind = [\"/a\",\n 7]\n", "p.toml:3: invalid type: integer `7`, expected a string"),
        ("env as a table", "[sandbox]\nenv = { A = \"1\" }\n", "p.toml:2: invalid type: map, expected a sequence"),
        ("an empty unprotect entry", "[sandbox]\nunprotect = [\"\"]\n", "p.toml:2: invalid path \"\": expected a protected path, e.g. \".vscode\" or \"/srv/repo/.git/hooks\""),
        ("an unprotect entry leaving its folder", "[sandbox]\nunprotect = [\"../x/.git\"]\n", "p.toml:2: invalid path \"../x/.git\": a path cannot have . or .. components; write it out"),
    ];
    for (case, text, want) in table {
        match from_toml(text, "p.toml") {
            Ok(_) => panic!("{case}: accepted"),
            Err(e) => assert_eq!(e.to_string(), *want, "{case}"),
        }
    }
}
