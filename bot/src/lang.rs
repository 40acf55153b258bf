//! parlor's own sentences in a group's language: one catalog, English and Simplified
//! Chinese (QQ groups, where parlor started, mostly speak Chinese). Every notice the session
//! layer posts itself (limits, budgets, compaction, approvals, settings, command answers)
//! comes from here, chosen by the group's `language` setting; what the model writes is the
//! model's. A sentence takes its arguments by name (`{name}`); [`say`] fills them in.
//!
//! Both columns of the table are required by its macro, and a test checks that each pair
//! names the same arguments, so a key can never be missing in one language.

use serde::{Deserialize, Serialize};

/// A language parlor speaks its own notices in.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Lang {
    /// English, the default.
    #[default]
    En,
    /// Simplified Chinese.
    Zh,
}

impl Lang {
    /// Every language, in the order `/settings` lists them.
    pub const ALL: [Lang; 2] = [Lang::En, Lang::Zh];

    /// `en`, `zh` (and a few spellings people type: `english`, `zh-cn`, `中文`).
    pub fn parse(text: &str) -> Option<Lang> {
        match text.trim().to_lowercase().as_str() {
            "en" | "english" | "en-us" | "en-gb" => Some(Lang::En),
            "zh" | "zh-cn" | "zh-hans" | "chinese" | "中文" | "简体中文" => Some(Lang::Zh),
            _ => None,
        }
    }

    /// `en`, `zh`.
    pub fn as_str(self) -> &'static str {
        match self {
            Lang::En => "en",
            Lang::Zh => "zh",
        }
    }
}

macro_rules! catalog {
    ($($key:ident => $en:expr, $zh:expr;)*) => {
        /// One sentence of the catalog.
        #[derive(Debug, Clone, Copy, PartialEq, Eq)]
        #[allow(missing_docs)]
        pub enum Msg { $($key,)* }

        impl Msg {
            /// Every key, for the test that both languages have it.
            pub const ALL: &'static [Msg] = &[$(Msg::$key,)*];

            /// The sentence in `lang`, its arguments still `{named}`.
            pub fn text(self, lang: Lang) -> &'static str {
                match (self, lang) {
                    $((Msg::$key, Lang::En) => $en,
                      (Msg::$key, Lang::Zh) => $zh,)*
                }
            }
        }
    };
}

catalog! {
    QueueFull =>
        "I have too many messages waiting in this chat; please ask again in a minute.",
        "这个群里等我回复的消息太多了，请过一分钟再问。";
    ChatBudgetSpent =>
        "I have used up today's token budget for this chat, so I will not answer until tomorrow (UTC). The bot's operator can raise the limit.",
        "我今天在这个群的 token 预算已用完，明天（UTC）之前不再回答。机器人的运营者可以提高上限。";
    MemberBudgetSpent =>
        "{names} has used up today's token budget, so I will not answer until tomorrow (UTC). The bot's operator can raise the limit.",
        "{names} 今天的 token 预算已用完，明天（UTC）之前我不再回答。机器人的运营者可以提高上限。";
    MemberGroupBudgetSpent =>
        "{names} has used up today's token budget in this group ({limit} tokens), so I will not answer until tomorrow (UTC).",
        "{names} 今天在本群的 token 预算（{limit}）已用完，明天（UTC）之前我不再回答。";
    MemberTurnsSpent =>
        "{name}, you have asked me {limit} times in the last hour, the most this group allows. I will answer you again in about {minutes} min; until then I only read along.",
        "{name}，你在过去一小时内已经问了我 {limit} 次，达到本群的上限。大约 {minutes} 分钟后我会再回答你；在此之前我只读不答。";
    CommandFlood =>
        "Too many commands: {who} several in the last minute. I will answer commands again in about {secs} s; mentions are answered as usual.",
        "命令太多了：{who}在过去一分钟内发了好几条。大约 {secs} 秒后我再回应命令；提到我的消息照常回答。";
    CommandFloodMember => "you sent", "你";
    CommandFloodChat => "this chat sent", "本群";
    EmptyAnswer =>
        "The model sent an empty answer. Please ask again, perhaps in other words.",
        "模型返回了空回答。请再问一次，也许换个说法。";
    ContextSummarized =>
        "(This conversation had grown too long for the model, so I summarized its older part.)",
        "（对话太长，超出了模型的上下文，所以我把较早的部分总结了。）";
    ContextForgotten =>
        "(This conversation had grown too long for the model, so I forgot its older part.)",
        "（对话太长，超出了模型的上下文，所以我忘掉了较早的部分。）";
    CompactedAtThreshold =>
        "(This conversation is getting long for my memory, so I summarized its older part; the last few turns stay word for word.)",
        "（这段对话对我的记忆来说有点长了，所以我总结了较早的部分；最近几轮原样保留。）";
    TrimmedAtThreshold =>
        "(This conversation is getting long for my memory and I could not summarize it, so I let its older part go.)",
        "（这段对话对我的记忆来说有点长了，我没能总结它，所以放掉了较早的部分。）";
    FailConnect =>
        "Sorry, I could not reach the language model. Please try again in a few minutes.",
        "抱歉，我联系不上语言模型。请过几分钟再试。";
    FailTimeout =>
        "Sorry, the language model did not answer in time ({secs}s). Please try again.",
        "抱歉，语言模型没有按时回答（{secs} 秒）。请再试一次。";
    FailNoAnswerYet =>
        "Sorry, the local language model had not begun to answer after {minutes} minutes. The operator can raise llm.first_token_timeout_secs or use a smaller model.",
        "抱歉，本地语言模型 {minutes} 分钟后仍未开始回答。运营者可以调大 llm.first_token_timeout_secs 或换用更小的模型。";
    FailInterrupted =>
        "Sorry, the connection to the language model broke off mid-answer. Please try again.",
        "抱歉，与语言模型的连接在回答途中断开了。请再试一次。";
    FailTooLong =>
        "Sorry, this conversation is too long for the language model. An admin can send /reset to start over.",
        "抱歉，这段对话对语言模型来说太长了。管理员可以发送 /reset 重新开始。";
    FailRateLimited =>
        "Sorry, the language model is rate-limiting me right now. Please try again in a minute.",
        "抱歉，语言模型现在正在限制我的请求频率。请过一分钟再试。";
    FailCredentials =>
        "Sorry, the language model refused my credentials. The operator needs to check the API key.",
        "抱歉，语言模型拒绝了我的凭据。运营者需要检查 API 密钥。";
    FailServer =>
        "Sorry, the language model had a server error (HTTP {status}). Please try again later.",
        "抱歉，语言模型出现了服务器错误（HTTP {status}）。请稍后再试。";
    FailRefused =>
        "Sorry, the language model refused the request (HTTP {status}). The operator can find the details in the log.",
        "抱歉，语言模型拒绝了请求（HTTP {status}）。运营者可以在日志里看到详情。";
    FailStream =>
        "Sorry, the language model reported an error mid-answer. Please try again.",
        "抱歉，语言模型在回答途中报告了错误。请再试一次。";
    FailMalformed =>
        "Sorry, the language model sent an answer I could not read. Please try again.",
        "抱歉，语言模型发来的回答我读不懂。请再试一次。";
    FailCancelled => "Sorry, the request was cancelled.", "抱歉，请求被取消了。";
    ResetNotAdmin => "Only an admin can reset this chat.", "只有管理员可以重置本群的对话。";
    ResetDone =>
        "Done: I forgot this chat's conversation (and its summary) and plans.",
        "完成：我忘掉了本群的对话（及其摘要）和计划。";
    CompactNotAdmin => "Only an admin can compact this chat.", "只有管理员可以压缩本群的对话。";
    CompactUnreadable =>
        "I could not read this conversation to summarize it; nothing was changed.",
        "我读不到这段对话，无法总结；什么都没有改。";
    CompactStopped => "Stopped: nothing was changed.", "已停止：什么都没有改。";
    CompactNothing =>
        "There is nothing to summarize yet: the conversation is {turns} turn(s) long, and I keep the last {keep} word for word.",
        "还没有可以总结的内容：对话只有 {turns} 轮，而最近 {keep} 轮我会原样保留。";
    CompactFailed =>
        "I could not summarize the conversation (the model did not answer usefully); nothing was changed.",
        "我没能总结这段对话（模型没有给出有用的回答）；什么都没有改。";
    CompactDone =>
        "Done: I summarized {dropped} older messages into about {tokens} tokens; the last {kept} turn(s) stay word for word.",
        "完成：我把 {dropped} 条较早的消息总结成了约 {tokens} 个 token；最近 {kept} 轮原样保留。";
    SetAside =>
        "I set aside a message from {who}: working on it stopped me twice, so I will not try it again. The operator can find it in the log.",
        "我把 {who} 的一条消息放到了一边：处理它让我停机了两次，所以不会再试。运营者可以在日志里找到它。";
    CommandGone => "{word} is not available any more.", "{word} 已不可用。";
    CommandNeedsRole => "Only {role} may use {word} here.", "在这里只有{role}可以使用 {word}。";
    MemoryStatus =>
        "Memory: {count} entries ({unconfirmed} unconfirmed), {chars} characters; search index {terms} terms, {kb} KB",
        "记忆：{count} 条（{unconfirmed} 条未确认），共 {chars} 个字符；搜索索引 {terms} 个词项，{kb} KB";
    MemoryEmpty => "I remember nothing in this chat yet.", "我在这个聊天里还什么都没记住。";
    MemoryHeader =>
        "What I remember in this chat ({count} entries, newest first):",
        "我在这个聊天里记住的内容（{count} 条，最新的在前）：";
    MemoryUnconfirmed => "unconfirmed", "未确认";
    MemoryFrom => "from {name}", "来自 {name}";
    MemoryMore => "… and {more} more.", "……还有 {more} 条。";
    MemoryForgot => "Forgot {key}.", "已忘记 {key}。";
    MemoryNoKey => "There is no entry {key} here; /memory lists them.", "这里没有 {key} 这一条；/memory 会列出所有条目。";
    MemoryForgotYou =>
        "Forgot {count} entries that came from what you said here.",
        "已忘记 {count} 条来自你在这里所说内容的记录。";
    MemoryAboutYou =>
        "What I remember here from what you said ({count} entries):",
        "我在这里记住的、来自你所说内容的记录（{count} 条）：";
    MemoryForgetUsage =>
        "Usage: /forget KEY (chat admins) or /forget me (what you told me).",
        "用法：/forget 条目名（群管理员）或 /forget me（忘记你告诉我的内容）。";
    HelpMemory =>
        "/memory — what I remember here; /memory me — what I remember from what you said\n/forget KEY — forget an entry (chat admins); /forget me — forget what you told me",
        "/memory — 我在这里记住的内容；/memory me — 来自你所说内容的记录\n/forget 条目名 — 忘记一条（群管理员）；/forget me — 忘记你告诉我的内容";
    Stopped => "Stopped.", "已停止。";
    NothingToStop => "I am not working on anything.", "我现在没有在做任何事。";
    ReloadNotOperator => "Only an operator of the bot may /reload.", "只有机器人的运营者可以使用 /reload。";
    SettingsHeader => "Settings of this group:", "本群的设置：";
    SettingsFooter =>
        "Chat admins change a setting with /set <key> <value> (/set <key> default goes back to the operator's default); /settings log shows who changed what.",
        "群管理员可以用 /set <项> <值> 修改设置（/set <项> default 恢复运营者的默认值）；/settings log 显示谁改了什么。";
    SettingsLocked => "locked by the operator", "已被运营者锁定";
    SettingsDefault => "default", "默认";
    SettingsCap => "at most {cap}", "最多 {cap}";
    SettingsNone => "none", "无";
    SettingsNoLimit => "no limit", "不限";
    SettingsNotAdmin =>
        "Only a chat admin can change this group's settings; everyone may read them with /settings.",
        "只有群管理员可以修改本群的设置；所有人都可以用 /settings 查看。";
    SettingsUnknownKey =>
        "There is no setting {key}. The settings are: {keys}.",
        "没有名为 {key} 的设置。可用的设置有：{keys}。";
    SettingsLockedKey =>
        "The operator has locked {key}; it stays {value}.",
        "运营者锁定了 {key}；它保持为 {value}。";
    SettingsBadValue => "{key} cannot be {value}: {why}", "{key} 不能设为 {value}：{why}";
    SettingsOverCap =>
        "{key} cannot be {value}: the operator's cap is {cap}.",
        "{key} 不能设为 {value}：运营者设定的上限是 {cap}。";
    SettingsChanged =>
        "{key} is now {value} (was {old}); it applies from the next answer.",
        "{key} 已改为 {value}（原为 {old}）；从下一次回答起生效。";
    SettingsUnchanged => "{key} is already {value}.", "{key} 已经是 {value}。";
    SettingsUsage =>
        "Usage: /set <key> <value>, for example /set reply_mode mention. /settings lists the keys.",
        "用法：/set <项> <值>，例如 /set reply_mode mention。/settings 列出所有设置项。";
    SettingsLogHeader => "Changes to this group's settings, newest first:", "本群设置的修改记录（最新的在前）：";
    SettingsLogEmpty => "Nobody has changed this group's settings yet.", "还没有人修改过本群的设置。";
    SettingsStoreFailed =>
        "I could not save the change; nothing was changed. Please try again.",
        "保存失败，什么都没有改。请再试一次。";
    ValueNotANumber => "it must be a whole number (or default)", "必须是整数（或 default）";
    ValueUnknownModel => "the models are {models}", "可选的模型有：{models}";
    ValueNoModels => "the operator has named no models for groups", "运营者没有为群提供可选模型";
    ValueUnknownMode => "the modes are mention, all, auto", "可选的模式有 mention、all、auto";
    ValueAutoNotAllowed => "the operator has not allowed auto-chat here", "运营者没有在这里开放自动聊天";
    ValueUnknownLanguage => "the languages are en, zh", "可选的语言有 en、zh";
    ValueUnknownToolsets => "the toolsets groups may use are {toolsets}", "本群可用的工具集有：{toolsets}";
    ValueAtLeastOne => "it must be 1 or more (or default)", "必须大于等于 1（或 default）";
    ValueTooLong => "it may be at most {max} characters", "最多 {max} 个字符";
    ApprovalAsk =>
        "{who} asked me to run {tool} with:\n{arguments}\nThis needs the yes of {role}: answer /approve {code} or /deny {code} within {minutes} min (or press a button, where there are any).",
        "{who} 让我运行 {tool}，参数：\n{arguments}\n这需要{role}同意：请在 {minutes} 分钟内回复 /approve {code} 或 /deny {code}（如有按钮，也可以直接点击）。";
    ApprovalApproveButton => "Approve", "批准";
    ApprovalDenyButton => "Deny", "拒绝";
    ApprovalRoleChatAdmin => "a chat admin", "群管理员";
    ApprovalRoleOperator => "an operator of the bot", "机器人的运营者";
    ApprovalApproved => "{tool} ({code}): approved by {who}.", "{tool}（{code}）：已由 {who} 批准。";
    ApprovalDenied => "{tool} ({code}): denied by {who}.", "{tool}（{code}）：已被 {who} 拒绝。";
    ApprovalExpired =>
        "{tool} ({code}): nobody decided within {minutes} min, so it did not run.",
        "{tool}（{code}）：{minutes} 分钟内没有人决定，所以没有运行。";
    ApprovalNotAllowed =>
        "Only {role} can decide this; nothing changed.",
        "只有{role}可以做这个决定；什么都没有改。";
    ApprovalUnknown =>
        "There is no approval {code} waiting in this chat.",
        "本群没有编号为 {code} 的待批准请求。";
    ApprovalAlreadyDecided =>
        "{code} was already decided: {state}.",
        "{code} 已经有决定了：{state}。";
    ApprovalStateApproved => "approved", "已批准";
    ApprovalStateDenied => "denied", "已拒绝";
    ApprovalStateExpired => "expired", "已过期";
    ApprovalUsage => "Usage: /approve CODE or /deny CODE.", "用法：/approve 编号 或 /deny 编号。";
    StatusBody =>
        "{state}\nQueued: {queued}\nHistory: {history} messages\nSummary: {summary}\nTurns since start: {turns}\nTokens today (UTC): {tokens} ({cache})\nYour tokens today, in every chat: {yours}{extra}\nModel: {model}{answered}\nTools: {tools}\nUp for {minutes} min",
        "{state}\n排队：{queued}\n历史：{history} 条消息\n摘要：{summary}\n启动以来的轮数：{turns}\n今日 token（UTC）：{tokens}（{cache}）\n你今天在所有群的 token：{yours}{extra}\n模型：{model}{answered}\n工具：{tools}\n已运行 {minutes} 分钟";
    StatusWorking => "Working on an answer.", "正在回答。";
    StatusIdle => "Idle.", "空闲。";
    StatusSummary =>
        "{chars} characters (about {tokens} tokens) for {messages} older messages, written {written}",
        "{chars} 个字符（约 {tokens} 个 token），概括 {messages} 条较早的消息，写于 {written}";
    StatusUnreadable => "unreadable", "无法读取";
    StatusOf => "{used} of {limit}", "{used} / {limit}";
    StatusLeft => "{of} ({left} left)", "{of}（剩余 {left}）";
    StatusCache => "{percent}% of prompt tokens read from the cache", "{percent}% 的提示 token 来自缓存";
    StatusNoPrompt => "no prompt yet", "还没有请求";
    StatusCost => "cost {cost}", "费用 {cost}";
    StatusAnsweredBy => " (last answer by {model})", "（上次回答来自 {model}）";
    StatusMemberGroupTokens =>
        "Your tokens today in this group: {of}",
        "你今天在本群的 token：{of}";
    StatusMemberTurns =>
        "Your turns in this group in the last hour: {used} of {limit}",
        "你在本群过去一小时的提问次数：{used} / {limit}";
    HelpIntro =>
        "Mention me or reply to one of my messages to talk to me.",
        "提到我或回复我的消息就可以和我说话。";
    HelpCommands =>
        "Commands:\n/help — this text\n/status — what I am doing\n/stop — stop my current answer\n/reset — forget this chat's conversation and plan, after the current answer; its memory stays (chat admins in groups)\n/compact [topic] — summarize the older part of the conversation, focused on the topic if given (chat admins in groups)\n/settings — this group's settings; /set <key> <value> changes one (chat admins)\n/approve CODE, /deny CODE — decide a tool call that waits for approval\n/reload — re-read the skills and other files the tools load (operators)",
        "命令：\n/help — 显示本说明\n/status — 我正在做什么\n/stop — 停止当前的回答\n/reset — 在当前回答之后忘掉本群的对话和计划；记忆保留（群里仅限管理员）\n/compact [主题] — 总结较早的对话，可指定侧重的主题（群里仅限管理员）\n/settings — 本群的设置；/set <项> <值> 修改（群管理员）\n/approve 编号、/deny 编号 — 决定一个等待批准的工具调用\n/reload — 重新读取技能等工具加载的文件（运营者）";
    HelpTools => "Tools I can use:", "我能用的工具：";
    HelpApproval => "needs approval of {role}", "需要{role}批准";
}

/// `msg` in `lang` with each `{name}` of `args` filled in, in one pass: a value (a member's
/// name, say) that holds `{something}` is never filled in itself.
pub fn say(lang: Lang, msg: Msg, args: &[(&str, &str)]) -> String {
    let template = msg.text(lang);
    let mut out = String::with_capacity(template.len() + 32);
    let mut rest = template;
    while let Some(open) = rest.find('{') {
        out.push_str(&rest[..open]);
        let after = &rest[open + 1..];
        let value = after.find('}').and_then(|close| {
            let name = &after[..close];
            args.iter()
                .find(|(n, _)| *n == name)
                .map(|(_, v)| (close, *v))
        });
        match value {
            Some((close, value)) => {
                out.push_str(value);
                rest = &after[close + 1..];
            }
            None => {
                out.push('{');
                rest = after;
            }
        }
    }
    out.push_str(rest);
    out
}

/// The `{names}` a sentence takes, sorted.
pub fn arguments(text: &str) -> Vec<&str> {
    let mut names: Vec<&str> = text
        .split('{')
        .skip(1)
        .filter_map(|rest| rest.split_once('}').map(|(name, _)| name))
        .filter(|name| !name.is_empty() && name.chars().all(|c| c.is_ascii_lowercase()))
        .collect();
    names.sort_unstable();
    names.dedup();
    names
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_key_exists_in_both_languages_with_the_same_arguments() {
        for msg in Msg::ALL {
            let en = msg.text(Lang::En);
            let zh = msg.text(Lang::Zh);
            assert!(!en.trim().is_empty(), "{msg:?} has no English");
            assert!(!zh.trim().is_empty(), "{msg:?} has no Chinese");
            assert_ne!(en, zh, "{msg:?} is not translated");
            assert_eq!(
                arguments(en),
                arguments(zh),
                "{msg:?} names other arguments"
            );
        }
    }

    #[test]
    fn a_value_is_never_filled_in_itself() {
        let text = say(
            Lang::En,
            Msg::MemberTurnsSpent,
            &[("name", "{limit}"), ("limit", "2"), ("minutes", "5")],
        );
        assert!(
            text.starts_with("{limit}, you have asked me 2 times"),
            "{text}"
        );
    }

    #[test]
    fn arguments_are_filled_in_by_name() {
        let text = say(
            Lang::Zh,
            Msg::SettingsOverCap,
            &[
                ("key", "member_turns_per_hour"),
                ("value", "50"),
                ("cap", "20"),
            ],
        );
        assert_eq!(
            text,
            "member_turns_per_hour 不能设为 50：运营者设定的上限是 20。"
        );
        assert_eq!(Lang::parse("ZH-cn"), Some(Lang::Zh));
        assert_eq!(Lang::parse("fr"), None);
    }
}
