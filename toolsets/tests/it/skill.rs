//! The skill toolset over real folders: the listing in the system prompt, loading a body and
//! its resources, every way out of a skill's folder refused, problems reported with their
//! file, per-chat skills, and a reload reaching the prompt.

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Arc;

use parlor_bot::agent::{Agent, AgentConfig};
use parlor_bot::testing::ScriptedLlm;
use parlor_bot::tool::{Caller, ToolContext, ToolInvocation, ToolRegistry, ToolResult, ToolSet};
use parlor_toolsets::skill::{SkillLibrary, SkillOptions, confined, load, skill_toolset};
use serde_json::{Value, json};

fn write(path: &Path, text: &str) {
    std::fs::create_dir_all(path.parent().unwrap()).unwrap();
    std::fs::write(path, text).unwrap();
}

fn skill_md(name: &str, description: &str, body: &str) -> String {
    format!("---\nname: {name}\ndescription: {description}\n---\n{body}\n")
}

/// A skills folder with `deploy` (a body and two resources) and `triage`.
fn folder() -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    write(
        &dir.path().join("deploy/SKILL.md"),
        &skill_md(
            "deploy",
            "How to ship a release of the app. Use when asked to deploy.",
            "# Deploy\n\n1. Read `checklist.md`.\n2. Fill `templates/notes.md`.",
        ),
    );
    write(
        &dir.path().join("deploy/checklist.md"),
        "- tests green\n- tag pushed\n",
    );
    write(
        &dir.path().join("deploy/templates/notes.md"),
        "Release {version}\n",
    );
    write(
        &dir.path().join("triage/SKILL.md"),
        &skill_md(
            "triage",
            "Sort a bug report.",
            "Ask for steps to reproduce.",
        ),
    );
    dir
}

fn cx(session: &str) -> ToolContext {
    ToolContext {
        session: session.to_owned(),
        caller: Caller {
            user_id: "test:bob".into(),
            name: "bob".into(),
            ..Caller::default()
        },
        ..ToolContext::default()
    }
}

async fn call(tools: &dyn ToolSet, session: &str, name: &str, args: Value) -> Value {
    let r: ToolResult = tools
        .invoke(
            ToolInvocation {
                id: "c1".into(),
                name: name.into(),
                arguments: args,
            },
            cx(session),
        )
        .await;
    serde_json::from_str(&r.to_json()).unwrap()
}

fn agent_over(library: &Arc<SkillLibrary>) -> Agent {
    let registry = ToolRegistry::new(vec![Arc::new(skill_toolset(Arc::clone(library)))]).unwrap();
    Agent::new(
        ScriptedLlm::new(vec![]),
        registry,
        "base",
        AgentConfig::default(),
    )
}

#[tokio::test]
async fn the_prompt_lists_names_and_descriptions_and_skill_loads_the_body_and_its_files() {
    let dir = folder();
    let library = SkillLibrary::new(SkillOptions::new(vec![dir.path().to_owned()]));
    assert!(library.problems().is_empty(), "{:?}", library.problems());
    let agent = agent_over(&library);
    let prompt = agent.system_prompt();
    assert!(
        prompt.contains("- deploy: How to ship a release of the app. Use when asked to deploy."),
        "{prompt}"
    );
    assert!(prompt.contains("- triage: Sort a bug report."), "{prompt}");
    assert!(
        !prompt.contains("Fill `templates"),
        "bodies stay out of the prompt"
    );

    let tools = skill_toolset(library);
    let r = call(&tools, "test:-1", "skill", json!({"name": "deploy"})).await;
    assert_eq!(r["success"], true, "{r}");
    assert!(
        r["data"]["instructions"]
            .as_str()
            .unwrap()
            .starts_with("# Deploy")
    );
    assert_eq!(
        r["data"]["resources"],
        json!(["checklist.md", "templates/notes.md"])
    );
    let r = call(
        &tools,
        "test:-1",
        "skill_read",
        json!({"name": "deploy", "path": "templates/notes.md"}),
    )
    .await;
    assert_eq!(r["data"]["text"], "Release {version}\n", "{r}");
    let r = call(&tools, "test:-1", "skill", json!({"name": "nope"})).await;
    assert_eq!(r["error_code"], "SKILL_NOT_FOUND");
    assert!(r["message"].as_str().unwrap().contains("deploy, triage"));
}

#[tokio::test]
async fn every_way_out_of_a_skills_folder_is_refused() {
    let dir = folder();
    let outside = tempfile::tempdir().unwrap();
    write(&outside.path().join("secret.txt"), "token=abc");
    std::os::unix::fs::symlink(
        outside.path().join("secret.txt"),
        dir.path().join("deploy/link-out.txt"),
    )
    .unwrap();
    std::os::unix::fs::symlink(outside.path(), dir.path().join("deploy/dir-out")).unwrap();
    // A link that stays inside is an ordinary file of the skill.
    std::os::unix::fs::symlink("checklist.md", dir.path().join("deploy/same.md")).unwrap();
    let library = SkillLibrary::new(SkillOptions::new(vec![dir.path().to_owned()]));
    let tools = skill_toolset(library);
    for path in [
        "/etc/passwd",
        "../triage/SKILL.md",
        "templates/../../triage/SKILL.md",
        "link-out.txt",
        "dir-out/secret.txt",
    ] {
        let r = call(
            &tools,
            "test:-1",
            "skill_read",
            json!({"name": "deploy", "path": path}),
        )
        .await;
        assert_eq!(r["error_code"], "PERMISSION_DENIED", "{path}: {r}");
        assert!(!r.to_string().contains("token=abc"));
    }
    let r = call(
        &tools,
        "test:-1",
        "skill_read",
        json!({"name": "deploy", "path": "same.md"}),
    )
    .await;
    assert_eq!(r["data"]["text"], "- tests green\n- tag pushed\n", "{r}");
    let r = call(
        &tools,
        "test:-1",
        "skill_read",
        json!({"name": "deploy", "path": "missing.md"}),
    )
    .await;
    assert_eq!(r["error_code"], "RESOURCE_NOT_FOUND");
    // The listing does not offer the links out either.
    let root = dir.path().join("deploy").canonicalize().unwrap();
    assert!(confined(&root, "link-out.txt").is_err());
}

#[test]
fn bad_skills_are_reported_with_their_file_and_skipped_and_the_good_ones_load() {
    let dir = folder();
    let p = dir.path();
    write(&p.join("no-front/SKILL.md"), "# Just a body\n");
    write(
        &p.join("bad-yaml/SKILL.md"),
        "---\nname: [unclosed\n---\nbody\n",
    );
    write(
        &p.join("no-desc/SKILL.md"),
        "---\nname: no-desc\n---\nbody\n",
    );
    write(
        &p.join("bad-name/SKILL.md"),
        &skill_md("Bad_Name", "x", "body"),
    );
    write(
        &p.join("zz-dup/SKILL.md"),
        &skill_md("deploy", "another deploy", "body"),
    );
    write(&p.join("not-a-skill/readme.md"), "no SKILL.md here");
    let catalog = load(&[p.to_owned(), p.join("missing-folder")]);
    assert_eq!(
        catalog.skills.keys().collect::<Vec<_>>(),
        vec!["deploy", "triage"]
    );
    let problems: BTreeMap<String, String> = catalog
        .problems
        .iter()
        .map(|pr| {
            let rel = pr
                .path
                .strip_prefix(p)
                .unwrap_or(&pr.path)
                .display()
                .to_string();
            (rel, pr.problem.clone())
        })
        .collect();
    assert!(
        problems["no-front/SKILL.md"].contains("no frontmatter"),
        "{problems:?}"
    );
    assert!(
        problems["bad-yaml/SKILL.md"].contains("not valid YAML"),
        "{problems:?}"
    );
    assert!(
        problems["no-desc/SKILL.md"].contains("no `description`"),
        "{problems:?}"
    );
    assert!(
        problems["bad-name/SKILL.md"].contains("\"Bad_Name\" is invalid"),
        "{problems:?}"
    );
    assert!(
        problems["zz-dup/SKILL.md"].contains("already taken"),
        "{problems:?}"
    );
    assert!(
        problems["missing-folder"].contains("cannot read the skills folder"),
        "{problems:?}"
    );
    assert_eq!(problems.len(), 6, "{problems:?}");
}

#[tokio::test]
async fn a_skill_for_some_chats_is_named_only_in_their_turns_and_refused_elsewhere() {
    let dir = folder();
    let mut options = SkillOptions::new(vec![dir.path().to_owned()]);
    options
        .chats
        .insert("deploy".into(), vec!["test:-ops".into()]);
    let library = SkillLibrary::new(options);
    let agent = agent_over(&library);
    let prompt = agent.system_prompt();
    assert!(!prompt.contains("deploy"), "{prompt}");
    assert!(prompt.contains("- triage"));
    let here = agent.tools().injections("test:-ops");
    assert_eq!(here.len(), 1);
    assert!(here[0].contains("- deploy: How to ship"), "{here:?}");
    assert!(agent.tools().injections("test:-other").is_empty());

    let tools = skill_toolset(library);
    let r = call(&tools, "test:-ops", "skill", json!({"name": "deploy"})).await;
    assert_eq!(r["success"], true);
    let r = call(&tools, "test:-other", "skill", json!({"name": "deploy"})).await;
    assert_eq!(r["error_code"], "SKILL_NOT_FOUND");
}

#[tokio::test]
async fn a_reload_reaches_the_system_prompt_and_says_what_it_found() {
    let dir = folder();
    let library = SkillLibrary::new(SkillOptions::new(vec![dir.path().to_owned()]));
    let agent = agent_over(&library);
    let before = agent.system_prompt();
    assert!(!before.contains("onboard"));

    // Nothing changed: the prompt is the very same text (the provider's cache keeps it).
    assert_eq!(agent.tools().reload().len(), 1);
    assert!(Arc::ptr_eq(&before, &agent.system_prompt()));

    write(
        &dir.path().join("onboard/SKILL.md"),
        &skill_md("onboard", "Welcome a new member.", "Say hi."),
    );
    write(&dir.path().join("broken/SKILL.md"), "no frontmatter");
    let lines = agent.fork().tools().reload();
    assert_eq!(lines.len(), 1);
    assert!(
        lines[0].starts_with("skills: 3 skills loaded (deploy, onboard, triage); 1 skipped:"),
        "{lines:?}"
    );
    assert!(lines[0].contains("broken/SKILL.md"), "{lines:?}");
    let after = agent.system_prompt();
    assert!(
        after.contains("- onboard: Welcome a new member."),
        "{after}"
    );
}
