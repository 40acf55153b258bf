//! `skill`: procedures operators teach the bot without code. A folder per skill, with a
//! `SKILL.md` of YAML frontmatter (`name`, `description`, as in the Agent Skills format other
//! agents read) and a Markdown body, plus optional resource files.
//!
//! - **Progressive disclosure:** the system prompt lists each skill's name and description;
//!   `skill {name}` returns the body and the list of its resource files; `skill_read {name,
//!   path}` reads one resource, confined to that skill's folder (no absolute path, no `..`,
//!   no symlink out of it: `PERMISSION_DENIED`).
//! - **Per chat:** a skill named in `[toolsets.skill.chats]` is offered only in the chats
//!   listed there; it is named in those chats' turns (an injection) instead of the shared
//!   system prompt, so the prompt stays one stable prefix for every chat.
//! - **Problems** (no frontmatter, a bad name, a missing description, a duplicate name, an
//!   unreadable file) are reported with the file at load ([`SkillLibrary::problems`],
//!   `check-config`, the log) and that skill is skipped; nothing here stops the daemon.
//! - **Reload:** [`SkillLibrary::reload`] re-reads the folders (`/reload` by an operator,
//!   SIGHUP); the new listing reaches the system prompt through
//!   [`ToolSet::prompt_version`].

use std::collections::{BTreeMap, BTreeSet};
use std::io::Read;
use std::path::{Component, Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, RwLock};

use async_trait::async_trait;
use gray_matter::Matter;
use gray_matter::engine::YAML;
use schemars::JsonSchema;
use serde::Deserialize;
use serde_json::json;

use parlor_bot::tool::{
    Risk, Role, ToolContext, ToolError, ToolInvocation, ToolResult, ToolSet, ToolSetBridge,
    ToolSpec, codes as shared,
};

use crate::support::{built, clip, finish};

/// The file that makes a folder a skill.
pub const SKILL_FILE: &str = "SKILL.md";

/// This toolset's error codes.
pub mod codes {
    /// No skill of that name is offered in this chat.
    pub const SKILL_NOT_FOUND: &str = "SKILL_NOT_FOUND";
    /// No such resource file in that skill.
    pub const RESOURCE_NOT_FOUND: &str = "RESOURCE_NOT_FOUND";
}

/// Where skills come from and who sees them.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct SkillOptions {
    /// Folders holding one folder per skill (each with a `SKILL.md`), read in order.
    pub dirs: Vec<PathBuf>,
    /// Skills offered only in some chats: skill name → the chats' session keys.
    pub chats: BTreeMap<String, Vec<String>>,
    /// Longest body `skill` returns, in characters.
    pub max_body_chars: usize,
    /// Longest resource text `skill_read` returns, in characters.
    pub max_resource_chars: usize,
}

impl SkillOptions {
    /// Options reading `dirs`, every skill in every chat, default limits.
    pub fn new(dirs: Vec<PathBuf>) -> Self {
        SkillOptions {
            dirs,
            chats: BTreeMap::new(),
            max_body_chars: 20_000,
            max_resource_chars: 20_000,
        }
    }
}

/// One loaded skill.
#[derive(Debug, Clone, PartialEq)]
pub struct Skill {
    /// Its name, from the frontmatter.
    pub name: String,
    /// When to use it, from the frontmatter.
    pub description: String,
    /// Its folder (canonical).
    pub dir: PathBuf,
    /// The Markdown after the frontmatter.
    pub body: String,
    /// Its other files, relative to its folder, sorted.
    pub resources: Vec<String>,
}

/// A skill that could not be loaded, and why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SkillProblem {
    /// The file or folder at fault.
    pub path: PathBuf,
    /// What is wrong, for the operator.
    pub problem: String,
}

impl std::fmt::Display for SkillProblem {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}: {}", self.path.display(), self.problem)
    }
}

/// What one read of the folders found.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct SkillCatalog {
    /// The skills, by name.
    pub skills: BTreeMap<String, Skill>,
    /// What was skipped, and why.
    pub problems: Vec<SkillProblem>,
}

/// Most resource files listed per skill; the rest are not offered.
const MAX_RESOURCES: usize = 200;
/// How deep resource folders are walked.
const MAX_DEPTH: usize = 4;
/// Largest `SKILL.md` read.
const MAX_SKILL_FILE: u64 = 256 * 1024;
/// Largest resource file read.
const MAX_RESOURCE_FILE: u64 = 2 * 1024 * 1024;

#[derive(Deserialize)]
struct Frontmatter {
    name: Option<String>,
    description: Option<String>,
}

/// Whether `name` is a skill name of the Agent Skills format: 1–64 lowercase letters,
/// digits and hyphens, neither starting nor ending with a hyphen.
pub fn is_valid_name(name: &str) -> bool {
    (1..=64).contains(&name.len())
        && name
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
        && !name.starts_with('-')
        && !name.ends_with('-')
}

/// Reads every skill under `dirs` (a missing folder is a problem, not an error).
pub fn load(dirs: &[PathBuf]) -> SkillCatalog {
    let mut catalog = SkillCatalog::default();
    for dir in dirs {
        let entries = match std::fs::read_dir(dir) {
            Ok(entries) => entries,
            Err(e) => {
                catalog.problems.push(SkillProblem {
                    path: dir.clone(),
                    problem: format!("cannot read the skills folder: {e}"),
                });
                continue;
            }
        };
        let mut folders: Vec<PathBuf> = entries
            .filter_map(Result::ok)
            .map(|e| e.path())
            .filter(|p| p.is_dir())
            .collect();
        folders.sort();
        for folder in folders {
            let file = folder.join(SKILL_FILE);
            if !file.is_file() {
                continue;
            }
            match load_one(&folder, &file) {
                Ok(skill) => {
                    if let Some(first) = catalog.skills.get(&skill.name) {
                        catalog.problems.push(SkillProblem {
                            path: file,
                            problem: format!(
                                "skill name {:?} is already taken by {}; this one is skipped",
                                skill.name,
                                first.dir.join(SKILL_FILE).display()
                            ),
                        });
                    } else {
                        catalog.skills.insert(skill.name.clone(), skill);
                    }
                }
                Err(problem) => catalog.problems.push(SkillProblem {
                    path: file,
                    problem: problem.to_string(),
                }),
            }
        }
    }
    catalog
}

/// Why a skill's folder is skipped, or a file of it cannot be read.
#[derive(Debug, thiserror::Error)]
enum SkillError {
    #[error("cannot open: {0}")]
    Open(std::io::Error),
    #[error("cannot read: {0}")]
    Read(std::io::Error),
    #[error("not UTF-8 text")]
    NotUtf8,
    #[error("the frontmatter is not valid YAML with string fields: {0}")]
    Frontmatter(String),
    #[error(
        "no frontmatter: the file must start with a `---` block holding `name` and \
         `description`"
    )]
    NoFrontmatter,
    #[error("the frontmatter has no `name`")]
    NoName,
    #[error(
        "name {0:?} is invalid: 1-64 lowercase letters, digits and hyphens, not starting or \
         ending with a hyphen"
    )]
    BadName(String),
    #[error("the frontmatter has no `description`")]
    NoDescription,
    #[error("the description is longer than 1024 characters")]
    LongDescription,
    #[error("cannot resolve the skill's folder: {0}")]
    Folder(std::io::Error),
}

fn load_one(folder: &Path, file: &Path) -> Result<Skill, SkillError> {
    let text = read_text(file, MAX_SKILL_FILE)?;
    let parsed = Matter::<YAML>::new()
        .parse::<Frontmatter>(&text)
        .map_err(|e| SkillError::Frontmatter(e.to_string()))?;
    let Some(front) = parsed.data else {
        return Err(SkillError::NoFrontmatter);
    };
    let name = front
        .name
        .map(|n| n.trim().to_owned())
        .filter(|n| !n.is_empty())
        .ok_or(SkillError::NoName)?;
    if !is_valid_name(&name) {
        return Err(SkillError::BadName(name));
    }
    let description = front
        .description
        .map(|d| d.split_whitespace().collect::<Vec<_>>().join(" "))
        .filter(|d| !d.is_empty())
        .ok_or(SkillError::NoDescription)?;
    if description.chars().count() > 1024 {
        return Err(SkillError::LongDescription);
    }
    let dir = folder.canonicalize().map_err(SkillError::Folder)?;
    let mut resources = Vec::new();
    list_resources(&dir, &dir, 0, &mut resources);
    resources.sort();
    Ok(Skill {
        name,
        description,
        dir,
        body: parsed.content.trim().to_owned(),
        resources,
    })
}

/// The regular files under `dir` (not following symlinks), relative to `root`.
fn list_resources(root: &Path, dir: &Path, depth: usize, out: &mut Vec<String>) {
    if depth > MAX_DEPTH || out.len() >= MAX_RESOURCES {
        return;
    }
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    let mut entries: Vec<_> = entries.filter_map(Result::ok).collect();
    entries.sort_by_key(std::fs::DirEntry::file_name);
    for entry in entries {
        let Ok(kind) = entry.file_type() else {
            continue;
        };
        let path = entry.path();
        if kind.is_dir() {
            list_resources(root, &path, depth + 1, out);
        } else if kind.is_file() {
            let Ok(relative) = path.strip_prefix(root) else {
                continue;
            };
            if relative == Path::new(SKILL_FILE) {
                continue;
            }
            if let Some(text) = relative.to_str() {
                out.push(text.to_owned());
            }
            if out.len() >= MAX_RESOURCES {
                return;
            }
        }
    }
}

/// A file's text, at most `max` bytes read; not UTF-8 is an error.
fn read_text(path: &Path, max: u64) -> Result<String, SkillError> {
    let file = std::fs::File::open(path).map_err(SkillError::Open)?;
    let mut bytes = Vec::new();
    file.take(max)
        .read_to_end(&mut bytes)
        .map_err(SkillError::Read)?;
    String::from_utf8(bytes).map_err(|_| SkillError::NotUtf8)
}

/// The skills of the bot: loaded at start, re-read on demand, shared by every session.
#[derive(Debug)]
pub struct SkillLibrary {
    options: SkillOptions,
    catalog: RwLock<Arc<SkillCatalog>>,
    version: AtomicU64,
}

impl SkillLibrary {
    /// Reads the folders of `options` now.
    pub fn new(options: SkillOptions) -> Arc<SkillLibrary> {
        let catalog = load(&options.dirs);
        log_problems(&catalog);
        Arc::new(SkillLibrary {
            options,
            catalog: RwLock::new(Arc::new(catalog)),
            version: AtomicU64::new(0),
        })
    }

    /// What the last read found.
    pub fn catalog(&self) -> Arc<SkillCatalog> {
        Arc::clone(&self.catalog.read().unwrap_or_else(|e| e.into_inner()))
    }

    /// What the last read skipped, and why.
    pub fn problems(&self) -> Vec<SkillProblem> {
        self.catalog().problems.clone()
    }

    /// Re-reads the folders; returns a line for the operator (what is loaded, what was
    /// skipped).
    pub fn reload(&self) -> String {
        let catalog = load(&self.options.dirs);
        log_problems(&catalog);
        let summary = summary(&catalog);
        let changed = {
            let mut slot = self.catalog.write().unwrap_or_else(|e| e.into_inner());
            let changed = **slot != catalog;
            *slot = Arc::new(catalog);
            changed
        };
        if changed {
            self.version.fetch_add(1, Ordering::Relaxed);
        }
        tracing::info!(changed, "skills re-read: {summary}");
        summary
    }

    /// Whether `name` is offered in the chat of `session`.
    fn offered_in(&self, name: &str, session: &str) -> bool {
        match self.options.chats.get(name) {
            None => true,
            Some(chats) => chats.iter().any(|c| c == session),
        }
    }

    /// The skill `name` when this chat may use it.
    fn get(&self, name: &str, session: &str) -> Result<Skill, ToolError> {
        let catalog = self.catalog();
        match catalog.skills.get(name) {
            Some(skill) if self.offered_in(name, session) => Ok(skill.clone()),
            _ => Err(ToolError::new(
                codes::SKILL_NOT_FOUND,
                format!(
                    "no skill {name:?} here; the skills you can use are listed in your \
                     instructions ({})",
                    self.names_in(session).join(", ")
                ),
            )),
        }
    }

    fn names_in(&self, session: &str) -> Vec<String> {
        self.catalog()
            .skills
            .keys()
            .filter(|n| self.offered_in(n, session))
            .cloned()
            .collect()
    }

    /// The system prompt's part: the skills offered in every chat.
    fn prompt(&self) -> Option<String> {
        let catalog = self.catalog();
        let lines: Vec<String> = catalog
            .skills
            .values()
            .filter(|s| !self.options.chats.contains_key(&s.name))
            .map(|s| format!("- {}: {}", s.name, s.description))
            .collect();
        let restricted = catalog
            .skills
            .keys()
            .any(|n| self.options.chats.contains_key(n));
        if lines.is_empty() && !restricted {
            return None;
        }
        Some(format!(
            "Skills are procedures the operators wrote for you. When a request matches a \
             skill's description, load it with `skill` first and follow it; `skill_read` reads \
             the files it mentions. Skills you have:\n{}",
            if lines.is_empty() {
                "(none in every chat; some chats name theirs in their messages)".to_owned()
            } else {
                lines.join("\n")
            }
        ))
    }

    /// The skills only this chat has, named in its turns.
    fn injection(&self, session: &str) -> Option<String> {
        let catalog = self.catalog();
        let lines: Vec<String> = catalog
            .skills
            .values()
            .filter(|s| {
                self.options
                    .chats
                    .get(&s.name)
                    .is_some_and(|chats| chats.iter().any(|c| c == session))
            })
            .map(|s| format!("- {}: {}", s.name, s.description))
            .collect();
        (!lines.is_empty()).then(|| {
            format!(
                "<CHAT_SKILLS>\nSkills for this chat (besides those in your instructions):\n{}\n</CHAT_SKILLS>",
                lines.join("\n")
            )
        })
    }

    /// `skill`.
    fn body(&self, args: SkillArgs, cx: &ToolContext) -> Result<ToolResult, ToolError> {
        let skill = self.get(&args.name, &cx.session)?;
        let body = clip(&skill.body, self.options.max_body_chars);
        Ok(ToolResult::ok_with(
            format!(
                "skill {}: follow these instructions; read the files they mention with \
                 skill_read",
                skill.name
            ),
            json!({
                "name": skill.name,
                "description": skill.description,
                "instructions": body,
                "resources": skill.resources,
            }),
        ))
    }

    /// `skill_read`.
    fn read(&self, args: SkillReadArgs, cx: &ToolContext) -> Result<ToolResult, ToolError> {
        let skill = self.get(&args.name, &cx.session)?;
        let path = confined(&skill.dir, &args.path)?;
        let text = read_text(&path, MAX_RESOURCE_FILE).map_err(|why| {
            ToolError::new(
                shared::UNAVAILABLE,
                format!(
                    "{} of skill {} cannot be read: {why}",
                    args.path, skill.name
                ),
            )
        })?;
        let chars = text.chars().count();
        let max = self.options.max_resource_chars;
        Ok(ToolResult::ok_with(
            format!(
                "{} of skill {} ({chars} characters{})",
                args.path,
                skill.name,
                if chars > max {
                    format!(", the first {max} shown")
                } else {
                    String::new()
                }
            ),
            json!({"name": skill.name, "path": args.path, "text": clip(&text, max)}),
        ))
    }
}

/// `relative` inside `root` (canonical), or why not: absolute paths, `..` and symlinks that
/// lead out are `PERMISSION_DENIED`, a missing file `RESOURCE_NOT_FOUND`.
pub fn confined(root: &Path, relative: &str) -> Result<PathBuf, ToolError> {
    let denied = |why: &str| {
        ToolError::permission_denied(format!(
            "{relative:?} is not a file of this skill: {why}; use a path from the skill's \
             resource list"
        ))
    };
    let path = Path::new(relative);
    if relative.trim().is_empty() {
        return Err(ToolError::invalid_arguments("skill_read: `path` is empty"));
    }
    if path.is_absolute() {
        return Err(denied("absolute paths are refused"));
    }
    if path
        .components()
        .any(|c| !matches!(c, Component::Normal(_) | Component::CurDir))
    {
        return Err(denied("`..` is refused"));
    }
    let joined = root.join(path);
    let real = joined.canonicalize().map_err(|_| {
        ToolError::new(
            codes::RESOURCE_NOT_FOUND,
            format!("this skill has no file {relative:?}; use a path from its resource list"),
        )
    })?;
    if !real.starts_with(root) {
        return Err(denied("it leads out of the skill's folder"));
    }
    if !real.is_file() {
        return Err(ToolError::new(
            codes::RESOURCE_NOT_FOUND,
            format!("{relative:?} is not a file of this skill"),
        ));
    }
    Ok(real)
}

fn summary(catalog: &SkillCatalog) -> String {
    let mut text = format!(
        "{} skill{} loaded",
        catalog.skills.len(),
        if catalog.skills.len() == 1 { "" } else { "s" }
    );
    if !catalog.skills.is_empty() {
        text.push_str(&format!(
            " ({})",
            catalog
                .skills
                .keys()
                .cloned()
                .collect::<Vec<_>>()
                .join(", ")
        ));
    }
    if !catalog.problems.is_empty() {
        text.push_str(&format!(
            "; {} skipped: {}",
            catalog.problems.len(),
            catalog
                .problems
                .iter()
                .map(ToString::to_string)
                .collect::<Vec<_>>()
                .join("; ")
        ));
    }
    text
}

fn log_problems(catalog: &SkillCatalog) {
    for problem in &catalog.problems {
        tracing::warn!(path = %problem.path.display(), problem = %problem.problem, "skill skipped");
    }
}

/// Arguments of `skill`.
#[derive(Debug, Clone, Deserialize, JsonSchema)]
pub struct SkillArgs {
    /// The skill's name, as listed.
    pub name: String,
}

/// Arguments of `skill_read`.
#[derive(Debug, Clone, Deserialize, JsonSchema)]
pub struct SkillReadArgs {
    /// The skill's name, as listed.
    pub name: String,
    /// A file of the skill, relative to its folder, as `skill` listed it.
    pub path: String,
}

/// The `skill` toolset: `skill` and `skill_read` over a [`SkillLibrary`], its listing in the
/// system prompt (re-read on [`ToolSet::reload`]).
#[derive(Debug, Clone)]
pub struct SkillToolset {
    library: Arc<SkillLibrary>,
    bridge: ToolSetBridge,
}

/// The toolset of `library`.
pub fn skill_toolset(library: Arc<SkillLibrary>) -> SkillToolset {
    let builder = ToolSetBridge::builder_with_state("skill", Arc::clone(&library))
        .add_function_with_state(
            "skill",
            "Load a skill: the operators' instructions for one kind of request, and the list \
             of its files. Use it when a request matches a skill's description.",
            |lib: Arc<SkillLibrary>, args: SkillArgs, cx: ToolContext| async move {
                finish(lib.body(args, &cx))
            },
        )
        .risk(Risk::Read)
        .role(Role::Member)
        .failure_codes(&[codes::SKILL_NOT_FOUND])
        .result_doc(
            "`data.instructions` (Markdown), `data.resources` (file paths), `data.description`.",
        )
        .add_function_with_state(
            "skill_read",
            "Read one file of a skill (a template, a checklist, a reference), by the path \
             `skill` listed. Only files inside that skill's folder can be read.",
            |lib: Arc<SkillLibrary>, args: SkillReadArgs, cx: ToolContext| async move {
                finish(lib.read(args, &cx))
            },
        )
        .risk(Risk::Read)
        .role(Role::Member)
        .failure_codes(&[codes::SKILL_NOT_FOUND, codes::RESOURCE_NOT_FOUND])
        .result_doc("`data.text`: the file's text (capped), `data.path`.");
    SkillToolset {
        library,
        bridge: built(builder),
    }
}

impl SkillToolset {
    /// The library behind it.
    pub fn library(&self) -> &Arc<SkillLibrary> {
        &self.library
    }
}

#[async_trait]
impl ToolSet for SkillToolset {
    fn name(&self) -> &str {
        self.bridge.name()
    }

    fn tools(&self) -> Vec<ToolSpec> {
        self.bridge.tools()
    }

    async fn invoke(&self, call: ToolInvocation, cx: ToolContext) -> ToolResult {
        self.bridge.invoke(call, cx).await
    }

    fn prompt(&self) -> Option<String> {
        self.library.prompt()
    }

    fn prompt_version(&self) -> u64 {
        self.library.version.load(Ordering::Relaxed)
    }

    fn iteration_prompt_injection(&self, session: &str) -> Option<String> {
        self.library.injection(session)
    }

    fn fork(&self) -> Arc<dyn ToolSet> {
        // No per-session state: every session reads the one library.
        Arc::new(self.clone())
    }

    fn reload(&self) -> Option<String> {
        Some(format!("skills: {}", self.library.reload()))
    }
}

/// The names of skills a configuration restricts to chats but no folder provides.
pub fn unknown_restricted(options: &SkillOptions, catalog: &SkillCatalog) -> BTreeSet<String> {
    options
        .chats
        .keys()
        .filter(|n| !catalog.skills.contains_key(*n))
        .cloned()
        .collect()
}
