//! The recall data: a synthetic 50-member group, its 1,000 memory entries, 200 questions each
//! answered by one entry in other words than it holds, the synonym groups the fake embedding
//! server is started with, and the filler entries of the 100,000-entry set.
//!
//! Everything comes from fixed tables and a fixed-seed LCG: every run builds the same data.
//! An entry is a member's fact (`{name}.{topic}`, a sentence from the topic's template with
//! slots filled) or one of 50 shared team facts (`team.standup`, `project.atlas.deadline`).
//! Members have 19 of the topics each, so entries share many words: every member's name
//! stands in 19 entries, every topic's words in a few dozen, and templates reuse words across
//! topics (`plays` in sports and instruments, `booked` in flights, `book` in reading).

use std::collections::HashSet;

/// Members of the group.
pub const MEMBERS: usize = 50;
/// Topics each member has an entry for.
const TOPICS_PER_MEMBER: usize = 19;
/// Questions per kind, in [`Kind`] order.
const QUOTA: [(Kind, usize); 4] = [
    (Kind::Synonym, 60),
    (Kind::Inflection, 60),
    (Kind::Chinese, 40),
    (Kind::Mixed, 40),
];

/// How a question's words differ from its answer's.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Kind {
    /// Another word for the same thing (`automobile` for `car`).
    Synonym,
    /// Another form of the same word (`booking flight` for `booked the flights`).
    Inflection,
    /// Chinese asked of a Chinese entry in other words (`小明哪天过生日` for `小明的生日是…`).
    Chinese,
    /// Both a synonym and another form, or English words asked of a Chinese entry.
    Mixed,
}

impl Kind {
    /// Its name in the report.
    pub fn name(self) -> &'static str {
        match self {
            Kind::Synonym => "synonym",
            Kind::Inflection => "inflection",
            Kind::Chinese => "chinese",
            Kind::Mixed => "mixed",
        }
    }
}

/// A member of the group.
#[derive(Debug, Clone)]
pub struct Member {
    /// Platform-qualified id, `telegram:30001`.
    pub id: String,
    /// Display name, as the entries spell it.
    pub name: String,
    /// The name in keys (lower-case ASCII; pinyin for Chinese names).
    pub key: String,
}

/// One memory entry, as the harness stores it.
#[derive(Debug, Clone)]
pub struct Fact {
    /// The entry key, lower case (`alice.birthday`).
    pub key: String,
    /// What the member said.
    pub content: String,
    /// Index into the members of who said it.
    pub author: usize,
    /// Minutes after the data's epoch it was last updated (the filler's are below zero):
    /// the order the toolset breaks ties by.
    pub minute: i64,
}

/// A question and the one entry that answers it.
#[derive(Debug, Clone)]
pub struct Question {
    /// What is asked, as a `memory_search` query.
    pub text: String,
    /// The key of the entry that answers it.
    pub key: String,
    /// How its words differ from the entry's.
    pub kind: Kind,
}

/// The recall data set.
pub struct Group {
    /// Its members.
    pub members: Vec<Member>,
    /// Its [`ENTRIES`] entries.
    pub facts: Vec<Fact>,
    /// The questions.
    pub questions: Vec<Question>,
}

/// A fixed-seed linear congruential generator (Knuth's MMIX constants): the data needs no
/// more randomness than a shuffle, and must be the same in every run.
pub struct Lcg(u64);

impl Lcg {
    /// A generator from `seed`.
    pub fn new(seed: u64) -> Self {
        Lcg(seed)
    }

    fn next(&mut self) -> u64 {
        self.0 = self
            .0
            .wrapping_mul(6_364_136_223_846_793_005)
            .wrapping_add(1_442_695_040_888_963_407);
        // The high bits of an LCG are the random ones.
        self.0 >> 33
    }

    /// A number in `0..n` (`n > 0`).
    pub fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }

    /// One item of a non-empty slice.
    pub fn pick<'a>(&mut self, items: &[&'a str]) -> &'a str {
        items[self.below(items.len())]
    }

    /// Shuffles `items` in place (Fisher–Yates).
    pub fn shuffle<T>(&mut self, items: &mut [T]) {
        for i in (1..items.len()).rev() {
            items.swap(i, self.below(i + 1));
        }
    }
}

/// A topic of a member's facts: the sentence template and the questions it answers.
/// Templates put the member's name at `{n}` (`{k}`: the key name) and slot values at `{a}`,
/// `{b}`.
struct Topic {
    key: &'static str,
    said: &'static str,
    a: &'static [&'static str],
    b: &'static [&'static str],
    questions: &'static [(Kind, &'static str)],
}

const COLOURS: &[&str] = &["red", "blue", "silver", "black", "white", "green"];
const MAKES: &[&str] = &["Toyota", "Honda", "Volvo", "Tesla", "Ford", "Skoda"];
const MONTHS: &[&str] = &[
    "January",
    "February",
    "March",
    "April",
    "May",
    "June",
    "July",
    "August",
    "September",
    "October",
    "November",
    "December",
];
const DAYS: &[&str] = &[
    "1st", "3rd", "5th", "8th", "11th", "14th", "17th", "19th", "22nd", "25th", "28th",
];
const WEEKDAYS: &[&str] = &[
    "Monday",
    "Tuesday",
    "Wednesday",
    "Thursday",
    "Friday",
    "Saturday",
    "Sunday",
];
const CITIES: &[&str] = &[
    "Lisbon", "Krakow", "Osaka", "Toronto", "Nairobi", "Valencia", "Dublin", "Hanoi",
];
const NEIGHBOURHOODS: &[&str] = &[
    "Riverside",
    "Old Town",
    "Hillcrest",
    "Docklands",
    "Greenfield",
    "Northgate",
];
const SEASONS: &[&str] = &["spring", "summer", "autumn", "winter"];
const PARTNERS: &[&str] = &["Sam", "Priya", "Jordan", "Alex", "Maria", "Chen", "Robin"];

/// The English topics; every English member has 19 of them.
const TOPICS: &[Topic] = &[
    Topic {
        key: "car",
        said: "{n} drives a {a} car, a {b}.",
        a: COLOURS,
        b: MAKES,
        questions: &[
            (Kind::Synonym, "what automobile does {n} have"),
            (Kind::Inflection, "what car is {n} driving these days"),
            (Kind::Mixed, "which vehicles is {n} driving"),
        ],
    },
    Topic {
        key: "birthday",
        said: "{n}'s birthday is on {a} {b}.",
        a: MONTHS,
        b: DAYS,
        questions: &[
            (Kind::Synonym, "when was {n} born"),
            (Kind::Inflection, "when does {n} celebrate birthdays"),
        ],
    },
    Topic {
        key: "pet",
        said: "{n}'s pet is a {a} called {b}.",
        a: &["dog", "cat", "parrot", "rabbit", "hamster", "tortoise"],
        b: &["Biscuit", "Luna", "Max", "Pepper", "Mochi", "Ziggy"],
        questions: &[
            (Kind::Synonym, "what animal does {n} own"),
            (Kind::Inflection, "what are {n}'s pets called"),
            (Kind::Mixed, "what are {n}'s animals named"),
        ],
    },
    Topic {
        key: "job",
        said: "{n} works as a {a} at {b}.",
        a: &[
            "nurse",
            "designer",
            "accountant",
            "teacher",
            "plumber",
            "engineer",
        ],
        b: &[
            "Globex",
            "Initech",
            "Umbrella Labs",
            "Stark Logistics",
            "the city hospital",
        ],
        questions: &[
            (Kind::Synonym, "what is {n}'s occupation"),
            (Kind::Inflection, "where is {n} working now"),
            (Kind::Mixed, "which employer has {n} worked for"),
        ],
    },
    Topic {
        key: "allergy",
        said: "{n} is allergic to {a}, so keep it away from them.",
        a: &[
            "peanuts",
            "shellfish",
            "cats",
            "pollen",
            "penicillin",
            "gluten",
        ],
        b: &[],
        questions: &[
            (Kind::Synonym, "is {n} intolerant to any food"),
            (Kind::Inflection, "does {n} have allergies"),
        ],
    },
    Topic {
        key: "coffee",
        said: "{n} takes their coffee {a}.",
        a: &[
            "black",
            "with oat milk",
            "with two sugars",
            "as a flat white",
            "as a double espresso",
        ],
        b: &[],
        questions: &[
            (
                Kind::Synonym,
                "what drink should we order for {n} at the cafe",
            ),
            (Kind::Inflection, "how many coffees does {n} take"),
        ],
    },
    Topic {
        key: "timezone",
        said: "{n} lives in the {a} time zone.",
        a: &[
            "Pacific",
            "Central European",
            "Eastern",
            "India Standard",
            "Japan Standard",
        ],
        b: &[],
        questions: &[
            (Kind::Inflection, "which zone is {n} living in"),
            (Kind::Mixed, "which timezones is {n} residing in"),
        ],
    },
    Topic {
        key: "phone",
        said: "{n} uses a {a} phone.",
        a: &[
            "Pixel 8",
            "iPhone 13",
            "Galaxy S23",
            "Fairphone 5",
            "Xperia 10",
        ],
        b: &[],
        questions: &[
            (Kind::Synonym, "which smartphone does {n} carry"),
            (Kind::Inflection, "which phones is {n} using"),
            (Kind::Mixed, "what mobiles is {n} using"),
        ],
    },
    Topic {
        key: "hobby",
        said: "In their free time {n} enjoys {a}.",
        a: &[
            "painting",
            "climbing",
            "knitting",
            "chess",
            "baking bread",
            "birdwatching",
        ],
        b: &[],
        questions: &[
            (Kind::Synonym, "what pastime does {n} have"),
            (Kind::Inflection, "what does {n} enjoy doing"),
        ],
    },
    Topic {
        key: "sport",
        said: "{n} plays {a} every {b}.",
        a: &[
            "tennis",
            "football",
            "badminton",
            "basketball",
            "volleyball",
            "squash",
        ],
        b: WEEKDAYS,
        questions: &[
            (Kind::Synonym, "what athletic pursuit does {n} follow"),
            (Kind::Inflection, "which day is {n} playing"),
        ],
    },
    Topic {
        key: "language",
        said: "{n} is learning {a} on Duolingo.",
        a: &[
            "Spanish",
            "Japanese",
            "Korean",
            "Italian",
            "Portuguese",
            "Mandarin",
        ],
        b: &[],
        questions: &[
            (Kind::Synonym, "which tongue is {n} studying"),
            (Kind::Inflection, "what does {n} learn"),
            (Kind::Mixed, "which languages does {n} study"),
        ],
    },
    Topic {
        key: "music",
        said: "{n}'s favourite band is {a}.",
        a: &[
            "Radiohead",
            "ABBA",
            "Daft Punk",
            "Coldplay",
            "Queen",
            "Arctic Monkeys",
        ],
        b: &[],
        questions: &[
            (Kind::Synonym, "what is {n}'s favorite group"),
            (Kind::Inflection, "which bands does {n} like"),
        ],
    },
    Topic {
        key: "commute",
        said: "{n} commutes by {a}, about {b} minutes each way.",
        a: &["train", "bus", "bike", "tram", "ferry", "car"],
        b: &["15", "20", "30", "45", "60"],
        questions: &[
            (Kind::Synonym, "how does {n} travel to the office"),
            (Kind::Inflection, "how long is {n}'s commuting time"),
        ],
    },
    Topic {
        key: "kids",
        said: "{n} has {a} kids; the youngest is {b}.",
        a: &["two", "three", "four"],
        b: &["two", "five", "eight", "eleven"],
        questions: &[
            (Kind::Synonym, "how many children does {n} have"),
            (Kind::Inflection, "how old is {n}'s youngest kid"),
        ],
    },
    Topic {
        key: "partner",
        said: "{n} is married to {a}.",
        a: PARTNERS,
        b: &[],
        questions: &[
            (Kind::Synonym, "who is {n}'s spouse"),
            (Kind::Inflection, "who did {n} marry"),
        ],
    },
    Topic {
        key: "vacation",
        said: "{n} is going on holiday to {a} in {b}.",
        a: CITIES,
        b: MONTHS,
        questions: &[
            (Kind::Synonym, "where will {n} spend the vacation"),
            (Kind::Inflection, "where is {n} going for the holidays"),
            (Kind::Mixed, "where is {n} vacationing"),
        ],
    },
    Topic {
        key: "flight",
        said: "{n} booked the flights to {a} for {b}.",
        a: CITIES,
        b: MONTHS,
        questions: &[
            (Kind::Synonym, "has {n} reserved a plane ticket"),
            (Kind::Inflection, "{n} booking flight"),
            (Kind::Mixed, "which planes has {n} reserved"),
        ],
    },
    Topic {
        key: "hotel",
        said: "{n} is staying at the {a} hotel near {b}.",
        a: &["Grand", "Harbour", "Ibis", "Marriott", "Central"],
        b: &["the station", "the old town", "the airport", "the beach"],
        questions: &[
            (Kind::Synonym, "where is {n}'s lodging"),
            (Kind::Inflection, "which hotels did {n} stay at"),
        ],
    },
    Topic {
        key: "dentist",
        said: "{n} has a dentist appointment on {a} at {b}.",
        a: WEEKDAYS,
        b: &["9:00", "11:30", "14:15", "16:45"],
        questions: &[
            (Kind::Synonym, "when is {n}'s dental checkup"),
            (Kind::Inflection, "when are {n}'s appointments"),
        ],
    },
    Topic {
        key: "gym",
        said: "{n} goes to the gym on {a} mornings.",
        a: WEEKDAYS,
        b: &[],
        questions: &[
            (Kind::Synonym, "when does {n} do fitness training"),
            (Kind::Inflection, "which morning is {n} going to the gym"),
            (Kind::Mixed, "what days is {n} exercising"),
        ],
    },
    Topic {
        key: "diet",
        said: "{n} follows a {a} diet.",
        a: &[
            "vegetarian",
            "vegan",
            "keto",
            "gluten-free",
            "pescatarian",
            "low-sugar",
        ],
        b: &[],
        questions: &[
            (Kind::Synonym, "what food can {n} eat"),
            (Kind::Inflection, "is {n} dieting"),
        ],
    },
    Topic {
        key: "shoes",
        said: "{n} wears size {a} shoes.",
        a: &["38", "39", "40", "41", "42", "43", "44", "45"],
        b: &[],
        questions: &[
            (Kind::Synonym, "what footwear size is {n}"),
            (Kind::Inflection, "what shoe size does {n} wear"),
        ],
    },
    Topic {
        key: "desk",
        said: "{n} sits at desk {a} on the {b} floor.",
        a: &["4", "7", "12", "15", "21", "33"],
        b: &["second", "third", "fourth", "fifth"],
        questions: &[
            (Kind::Synonym, "where is {n}'s workstation"),
            (Kind::Inflection, "where is {n} sitting"),
        ],
    },
    Topic {
        key: "home",
        said: "{n} moved to the {a} neighbourhood last {b}.",
        a: NEIGHBOURHOODS,
        b: SEASONS,
        questions: &[
            (Kind::Synonym, "which district does {n} reside in"),
            (Kind::Inflection, "where did {n} move to"),
        ],
    },
    Topic {
        key: "anniversary",
        said: "{n}'s wedding anniversary is on {a} {b}.",
        a: MONTHS,
        b: DAYS,
        questions: &[
            (Kind::Synonym, "when did {n} get married"),
            (Kind::Inflection, "when are {n}'s anniversaries"),
        ],
    },
    Topic {
        key: "garden",
        said: "{n} grows {a} in the garden.",
        a: &[
            "tomatoes",
            "roses",
            "herbs",
            "chillies",
            "strawberries",
            "potatoes",
        ],
        b: &[],
        questions: &[
            (Kind::Synonym, "what does {n} cultivate in the yard"),
            (Kind::Inflection, "what is {n} growing"),
            (Kind::Mixed, "what plants is {n} cultivating"),
        ],
    },
    Topic {
        key: "instrument",
        said: "{n} plays the {a} in a band on weekends.",
        a: &["drums", "bass", "violin", "saxophone", "piano", "ukulele"],
        b: &[],
        questions: &[(Kind::Inflection, "what instruments can {n} play")],
    },
    Topic {
        key: "reading",
        said: "{n} is reading {a} right now.",
        a: &[
            "Dune",
            "Middlemarch",
            "The Hobbit",
            "Sapiens",
            "Project Hail Mary",
            "Beloved",
        ],
        b: &[],
        questions: &[
            (Kind::Synonym, "which novel is {n} into at the moment"),
            (Kind::Inflection, "what does {n} read"),
        ],
    },
    Topic {
        key: "movie",
        said: "{n}'s favourite film is {a}.",
        a: &[
            "Alien",
            "Amelie",
            "Spirited Away",
            "Heat",
            "Casablanca",
            "Arrival",
        ],
        b: &[],
        questions: &[
            (Kind::Synonym, "what movie does {n} love most"),
            (Kind::Inflection, "which films does {n} like"),
        ],
    },
    Topic {
        key: "game",
        said: "{n} has been playing {a} on the console.",
        a: &[
            "Zelda",
            "Elden Ring",
            "Stardew Valley",
            "Tetris",
            "Minecraft",
        ],
        b: &[],
        questions: &[
            (Kind::Synonym, "which video game is {n} hooked on"),
            (Kind::Inflection, "what has {n} played lately"),
        ],
    },
    Topic {
        key: "laptop",
        said: "{n} works on a {a} laptop.",
        a: &[
            "ThinkPad",
            "MacBook Air",
            "Dell XPS",
            "Framework",
            "Surface",
        ],
        b: &[],
        questions: &[
            (Kind::Synonym, "what computer does {n} use"),
            (Kind::Inflection, "which laptops does {n} have"),
        ],
    },
    Topic {
        key: "hometown",
        said: "{n} grew up in {a}; it is their hometown.",
        a: CITIES,
        b: &[],
        questions: &[(Kind::Synonym, "which city was {n} raised in")],
    },
];

const CN_MONTHS: &[&str] = &[
    "一", "二", "三", "四", "五", "六", "七", "八", "九", "十", "十一", "十二",
];
const CN_DAYS: &[&str] = &["三", "八", "十二", "十五", "二十", "二十六", "三十"];
const CN_WEEKDAYS: &[&str] = &["一", "二", "三", "四", "五", "六", "日"];
const CN_CITIES: &[&str] = &["成都", "杭州", "西安", "青岛", "长沙", "厦门", "武汉"];

/// The Chinese topics; every Chinese member has 19 of them. Keys stay English, as the model
/// writes them.
const CN_TOPICS: &[Topic] = &[
    Topic {
        key: "birthday",
        said: "{n}的生日是{a}月{b}日。",
        a: CN_MONTHS,
        b: CN_DAYS,
        questions: &[
            (Kind::Chinese, "{n}哪天过生日"),
            (Kind::Chinese, "{n}是几月出生的"),
            (Kind::Mixed, "{n} birthday"),
        ],
    },
    Topic {
        key: "car",
        said: "{n}开一辆{a}的{b}汽车。",
        a: &["红色", "白色", "黑色", "银色"],
        b: &["比亚迪", "丰田", "大众", "特斯拉", "本田"],
        questions: &[
            (Kind::Chinese, "{n}的车子是什么牌子"),
            (Kind::Mixed, "what car does {n} drive"),
        ],
    },
    Topic {
        key: "pet",
        said: "{n}养了一只{a}当宠物，名字叫{b}。",
        a: &["猫", "狗", "兔子", "鹦鹉"],
        b: &["豆豆", "咪咪", "旺财", "球球"],
        questions: &[
            (Kind::Chinese, "{n}家的宠物叫什么"),
            (Kind::Mixed, "{k} 宠物 name"),
        ],
    },
    Topic {
        key: "hometown",
        said: "{n}的老家在{a}。",
        a: CN_CITIES,
        b: &[],
        questions: &[(Kind::Chinese, "{n}老家是哪个城市")],
    },
    Topic {
        key: "job",
        said: "{n}的工作是在{a}当{b}。",
        a: &["腾讯", "华为", "字节跳动", "一家银行", "一所中学"],
        b: &["工程师", "会计", "老师", "设计师", "产品经理"],
        questions: &[
            (Kind::Chinese, "{n}现在做什么工作"),
            (Kind::Mixed, "where does {n} work"),
        ],
    },
    Topic {
        key: "allergy",
        said: "{n}对{a}过敏，聚餐时要注意。",
        a: &["花生", "海鲜", "芒果", "花粉", "青霉素"],
        b: &[],
        questions: &[
            (Kind::Chinese, "{n}有什么过敏的东西吗"),
            (Kind::Mixed, "{n} allergies"),
        ],
    },
    Topic {
        key: "coffee",
        said: "{n}喝咖啡喜欢加{a}。",
        a: &["燕麦奶", "两块糖", "一份浓缩", "冰块"],
        b: &[],
        questions: &[(Kind::Chinese, "{n}的咖啡怎么点")],
    },
    Topic {
        key: "phone",
        said: "{n}用的手机是{a}。",
        a: &["华为Mate60", "小米14", "iPhone15", "OPPO Find X7"],
        b: &[],
        questions: &[
            (Kind::Chinese, "{n}拿的什么手机"),
            (Kind::Mixed, "{k} phone"),
        ],
    },
    Topic {
        key: "hobby",
        said: "{n}的爱好是{a}，周末常去。",
        a: &["爬山", "钓鱼", "画画", "下围棋", "摄影"],
        b: &[],
        questions: &[(Kind::Chinese, "{n}平时有啥爱好")],
    },
    Topic {
        key: "sport",
        said: "{n}每周{a}打{b}。",
        a: &["一", "二", "三", "四", "五"],
        b: &["篮球", "乒乓球", "网球", "羽毛球"],
        questions: &[(Kind::Chinese, "{n}什么时候打球")],
    },
    Topic {
        key: "language",
        said: "{n}最近在学{a}。",
        a: &["日语", "法语", "西班牙语", "德语", "韩语"],
        b: &[],
        questions: &[
            (Kind::Chinese, "{n}在学习哪种语言"),
            (Kind::Mixed, "which language is {n} learning"),
        ],
    },
    Topic {
        key: "music",
        said: "{n}最喜欢的歌手是{a}。",
        a: &["周杰伦", "王菲", "陈奕迅", "五月天", "邓紫棋"],
        b: &[],
        questions: &[(Kind::Chinese, "{n}喜欢听谁的歌")],
    },
    Topic {
        key: "commute",
        said: "{n}每天坐{a}上班，单程{b}分钟。",
        a: &["地铁", "公交", "班车", "轮渡"],
        b: &["二十", "三十", "四十五"],
        questions: &[(Kind::Chinese, "{n}怎么去上班")],
    },
    Topic {
        key: "kids",
        said: "{n}有{a}个孩子。",
        a: &["一", "两", "三"],
        b: &[],
        questions: &[
            (Kind::Chinese, "{n}家有几个小孩"),
            (Kind::Mixed, "how many kids does {n} have"),
        ],
    },
    Topic {
        key: "flight",
        said: "{n}订了{a}月{b}日去{c}的机票。",
        a: CN_MONTHS,
        b: CN_DAYS,
        questions: &[
            (Kind::Chinese, "{n}预订的航班是哪天"),
            (Kind::Mixed, "{n} flight date"),
        ],
    },
    Topic {
        key: "hotel",
        said: "{n}住在{c}的{a}酒店。",
        a: &["如家", "希尔顿", "全季", "亚朵"],
        b: &[],
        questions: &[(Kind::Chinese, "{n}住哪家酒店"), (Kind::Mixed, "{k} hotel")],
    },
    Topic {
        key: "dentist",
        said: "{n}约了星期{a}下午看牙医。",
        a: CN_WEEKDAYS,
        b: &[],
        questions: &[(Kind::Chinese, "{n}什么时候去看牙")],
    },
    Topic {
        key: "gym",
        said: "{n}每周{a}早上去健身房。",
        a: &["一", "二", "三", "四", "五", "六"],
        b: &[],
        questions: &[(Kind::Chinese, "{n}哪天去健身")],
    },
    Topic {
        key: "diet",
        said: "{n}吃素，饮食上不吃{a}。",
        a: &["肉", "鱼", "鸡蛋", "牛肉"],
        b: &[],
        questions: &[(Kind::Chinese, "{n}饮食有什么忌口")],
    },
    Topic {
        key: "shoes",
        said: "{n}穿{a}码的鞋。",
        a: &["三十九", "四十", "四十一", "四十二", "四十三"],
        b: &[],
        questions: &[
            (Kind::Chinese, "{n}的鞋码是多少"),
            (Kind::Mixed, "{n} shoe size"),
        ],
    },
    Topic {
        key: "home",
        said: "{n}去年搬到了{a}。",
        a: &["浦东", "海淀", "天河", "南山", "武侯"],
        b: &[],
        questions: &[(Kind::Chinese, "{n}现在搬去哪儿了")],
    },
    Topic {
        key: "anniversary",
        said: "{n}的结婚纪念日是{a}月{b}日。",
        a: CN_MONTHS,
        b: CN_DAYS,
        questions: &[(Kind::Chinese, "{n}哪天结婚的")],
    },
    Topic {
        key: "reading",
        said: "{n}最近在读的书是《{a}》。",
        a: &["三体", "活着", "围城", "红楼梦", "平凡的世界"],
        b: &[],
        questions: &[(Kind::Chinese, "{n}最近看什么书")],
    },
    Topic {
        key: "movie",
        said: "{n}最喜欢的电影是《{a}》。",
        a: &["流浪地球", "霸王别姬", "让子弹飞", "大话西游"],
        b: &[],
        questions: &[(Kind::Chinese, "{n}爱看哪部电影")],
    },
];

/// The 40 English members, then the 10 Chinese ones with their keys.
const NAMES: &[(&str, &str)] = &[
    ("Alice", "alice"),
    ("Bob", "bob"),
    ("Carol", "carol"),
    ("Dave", "dave"),
    ("Erin", "erin"),
    ("Frank", "frank"),
    ("Grace", "grace"),
    ("Heidi", "heidi"),
    ("Ivan", "ivan"),
    ("Judy", "judy"),
    ("Kevin", "kevin"),
    ("Laura", "laura"),
    ("Mallory", "mallory"),
    ("Nina", "nina"),
    ("Oscar", "oscar"),
    ("Peggy", "peggy"),
    ("Quentin", "quentin"),
    ("Rupert", "rupert"),
    ("Sybil", "sybil"),
    ("Trent", "trent"),
    ("Ursula", "ursula"),
    ("Victor", "victor"),
    ("Wendy", "wendy"),
    ("Xavier", "xavier"),
    ("Yvonne", "yvonne"),
    ("Zack", "zack"),
    ("Priya", "priya"),
    ("Tomasz", "tomasz"),
    ("Sofia", "sofia"),
    ("Mateo", "mateo"),
    ("Amara", "amara"),
    ("Kenji", "kenji"),
    ("Lucia", "lucia"),
    ("Omar", "omar"),
    ("Fatima", "fatima"),
    ("Sven", "sven"),
    ("Ingrid", "ingrid"),
    ("Diego", "diego"),
    ("Hana", "hana"),
    ("Noah", "noah"),
    ("小明", "xiaoming"),
    ("小红", "xiaohong"),
    ("阿强", "aqiang"),
    ("丽丽", "lili"),
    ("王伟", "wangwei"),
    ("李娜", "lina"),
    ("张磊", "zhanglei"),
    ("刘洋", "liuyang"),
    ("陈静", "chenjing"),
    ("杨帆", "yangfan"),
];

/// Whether a member's facts are in Chinese.
fn is_chinese(name: &str) -> bool {
    name.chars().any(|c| ('\u{4e00}'..='\u{9fff}').contains(&c))
}

/// A shared fact: (key, what was said, the questions it answers).
type Shared = (&'static str, &'static str, &'static [(Kind, &'static str)]);

/// The shared facts that are not per project.
const TEAM: &[Shared] = &[
    (
        "team.standup",
        "The team stand-up is at 9:30 every weekday in the Kepler room.",
        &[(Kind::Synonym, "what time is the daily scrum")],
    ),
    (
        "team.retro",
        "Retrospectives happen every second Friday after lunch.",
        &[(Kind::Inflection, "when is the next retrospective happening")],
    ),
    (
        "team.lunch",
        "The team lunch is on Thursdays at the Thai place on Elm Street.",
        &[(Kind::Synonym, "where do we eat together on thursday")],
    ),
    (
        "team.offsite",
        "The offsite is in Lisbon from the 12th to the 14th of June.",
        &[(Kind::Synonym, "where is the company retreat")],
    ),
    (
        "team.oncall",
        "Omar is on call this week; Sven takes over on Monday.",
        &[(Kind::Inflection, "who is taking the calls next")],
    ),
    (
        "trip.hotel",
        "For the trip we booked rooms at the Harbour View hotel.",
        &[(Kind::Synonym, "where is everyone lodging on the trip")],
    ),
    (
        "trip.train",
        "The train to Lisbon leaves at 7:42 from platform 3.",
        &[(Kind::Inflection, "when is the train leaving")],
    ),
    (
        "trip.budget",
        "Each person can spend up to 60 euros a day on the trip.",
        &[(Kind::Synonym, "what is the daily allowance for the trip")],
    ),
    (
        "office.wifi",
        "The office wifi network is Parlor-Guest and the password is on the fridge.",
        &[(
            Kind::Synonym,
            "what is the wireless internet name at the office",
        )],
    ),
    (
        "office.parking",
        "Parking spots in the garage are for people who cycle less than twice a week.",
        &[(Kind::Inflection, "who can park in the garage")],
    ),
    (
        "office.printer",
        "The printer on the third floor jams; use the one by the kitchen.",
        &[(Kind::Inflection, "which printers are jamming")],
    ),
    (
        "office.plants",
        "Grace waters the office plants on Mondays and Thursdays.",
        &[(Kind::Inflection, "who is watering the plants")],
    ),
    (
        "office.kitchen",
        "Clean the coffee machine every Friday afternoon.",
        &[(Kind::Mixed, "when is the espresso maker cleaned")],
    ),
    (
        "office.keys",
        "Spare keys are in the grey box behind reception.",
        &[(Kind::Inflection, "where is the spare key")],
    ),
    (
        "office.hours",
        "The office opens at 8:00 and closes at 19:00.",
        &[(Kind::Inflection, "when is the office opening")],
    ),
    (
        "team.holidays",
        "Everyone should enter their holidays in the shared calendar by March.",
        &[],
    ),
    (
        "team.birthdays",
        "We celebrate birthdays with cake on the last Friday of the month.",
        &[],
    ),
    (
        "team.bookclub",
        "The book club reads one novel a month and meets on Wednesdays.",
        &[],
    ),
    (
        "team.football",
        "A group plays football in the park on Tuesday evenings.",
        &[],
    ),
    (
        "team.secret_santa",
        "Secret Santa budget is 20 euros; names are drawn on December 1st.",
        &[],
    ),
    (
        "team.meeting_room",
        "Book the big meeting room through the calendar, not by email.",
        &[],
    ),
    (
        "team.release",
        "Releases go out on Tuesdays; nothing ships on Fridays.",
        &[],
    ),
    (
        "team.channel",
        "Urgent questions go to the ops channel, not direct messages.",
        &[],
    ),
    (
        "team.dress",
        "Client meetings need smart clothes; otherwise casual is fine.",
        &[],
    ),
    (
        "team.cake",
        "Whoever breaks the build brings a cake on Friday.",
        &[],
    ),
];

/// The projects of the per-project shared facts.
const PROJECTS: &[&str] = &["Atlas", "Borealis", "Comet", "Dynamo", "Ember"];

/// The per-project facts, keyed by suffix, `{p}` the project.
const PROJECT_FACTS: &[Shared] = &[
    (
        "deadline",
        "The {p} project deadline is {a} {b}.",
        &[(Kind::Synonym, "when is {p} due")],
    ),
    (
        "budget",
        "{p} has a budget of {c} thousand euros for this quarter.",
        &[(Kind::Synonym, "how much money does {p} get")],
    ),
    (
        "owner",
        "{m} owns the {p} project and runs its weekly sync.",
        &[(Kind::Synonym, "who leads {p}")],
    ),
    (
        "repo",
        "The {p} code lives in the {l}-core repository on the internal Git server.",
        &[(Kind::Inflection, "where are the {p} repositories")],
    ),
    (
        "demo",
        "The {p} demo for the customer is scheduled on {w} afternoon.",
        &[(Kind::Inflection, "when is {p} demoing")],
    ),
];

/// Fills a template.
fn fill(template: &str, slots: &[(&str, &str)]) -> String {
    let mut out = template.to_owned();
    for (name, value) in slots {
        out = out.replace(name, value);
    }
    out
}

/// A member's fact of `topic`, its slots drawn from `rng`.
fn member_fact(topic: &Topic, name: &str, rng: &mut Lcg) -> String {
    let a = rng.pick(topic.a);
    let b = if topic.b.is_empty() {
        ""
    } else {
        rng.pick(topic.b)
    };
    let c = rng.pick(CN_CITIES);
    fill(
        topic.said,
        &[("{n}", name), ("{a}", a), ("{b}", b), ("{c}", c)],
    )
}

/// The topics of a member.
fn topics_of(name: &str) -> &'static [Topic] {
    if is_chinese(name) { CN_TOPICS } else { TOPICS }
}

/// Builds the group: members, entries and questions.
pub fn group() -> Group {
    let mut rng = Lcg::new(0x5eed_2024);
    let members: Vec<Member> = NAMES
        .iter()
        .enumerate()
        .map(|(i, (name, key))| Member {
            id: format!("telegram:{}", 30_001 + i),
            name: (*name).to_owned(),
            key: (*key).to_owned(),
        })
        .collect();
    let mut facts = Vec::new();
    // (fact index, kind, question text) of every question the facts could answer.
    let mut candidates: Vec<(usize, Kind, String)> = Vec::new();
    for (m, member) in members.iter().enumerate() {
        let topics = topics_of(&member.name);
        let mut chosen: Vec<usize> = (0..topics.len()).collect();
        rng.shuffle(&mut chosen);
        chosen.truncate(TOPICS_PER_MEMBER);
        chosen.sort_unstable();
        for t in chosen {
            let topic = &topics[t];
            for (kind, template) in topic.questions {
                let text = fill(template, &[("{n}", &member.name), ("{k}", &member.key)]);
                candidates.push((facts.len(), *kind, text));
            }
            facts.push(Fact {
                key: format!("{}.{}", member.key, topic.key),
                content: member_fact(topic, &member.name, &mut rng),
                author: m,
                minute: 0,
            });
        }
    }
    for (key, said, questions) in TEAM {
        for (kind, text) in *questions {
            candidates.push((facts.len(), *kind, (*text).to_owned()));
        }
        facts.push(Fact {
            key: (*key).to_owned(),
            content: (*said).to_owned(),
            author: rng.below(MEMBERS),
            minute: 0,
        });
    }
    for project in PROJECTS {
        for (suffix, said, questions) in PROJECT_FACTS {
            let lower = project.to_lowercase();
            let owner = rng.below(MEMBERS);
            let budget = (20 + rng.below(180)).to_string();
            let content = fill(
                said,
                &[
                    ("{p}", project),
                    ("{l}", &lower),
                    ("{m}", &members[owner].name),
                    ("{a}", rng.pick(MONTHS)),
                    ("{b}", rng.pick(DAYS)),
                    ("{c}", &budget),
                    ("{w}", rng.pick(WEEKDAYS)),
                ],
            );
            for (kind, template) in *questions {
                candidates.push((facts.len(), *kind, fill(template, &[("{p}", project)])));
            }
            facts.push(Fact {
                key: format!("project.{lower}.{suffix}"),
                content,
                author: rng.below(MEMBERS),
                minute: 0,
            });
        }
    }
    // Distinct update times, in an order unrelated to the keys: ties fall as they may.
    let mut minutes: Vec<i64> = (0..facts.len() as i64).map(|i| i * 7).collect();
    rng.shuffle(&mut minutes);
    for (fact, minute) in facts.iter_mut().zip(minutes) {
        fact.minute = minute;
    }
    rng.shuffle(&mut candidates);
    let mut used = HashSet::new();
    let mut questions = Vec::new();
    for (kind, quota) in QUOTA {
        let mut taken = 0;
        for (fact, _, text) in candidates.iter().filter(|(_, k, _)| *k == kind) {
            if taken == quota {
                break;
            }
            if used.insert(*fact) {
                questions.push(Question {
                    text: text.clone(),
                    key: facts[*fact].key.clone(),
                    kind,
                });
                taken += 1;
            }
        }
    }
    Group {
        members,
        facts,
        questions,
    }
}

/// Syllables of the filler members' English names: none of them begins a real member's name.
const SYLLABLES: &[&str] = &[
    "ka", "lo", "mi", "ren", "tov", "dri", "pel", "nu", "ste", "vor", "gu", "bek", "zo", "tir",
    "mur", "quo", "fen", "ru", "hal", "dut", "os", "wex", "jo", "yil",
];
/// Surnames and given-name characters of the filler members' Chinese names, with pinyin;
/// none is in a real member's name, so no filler name holds one.
const CN_SURNAMES: &[(&str, &str)] = &[
    ("赵", "zhao"),
    ("钱", "qian"),
    ("孙", "sun"),
    ("周", "zhou"),
    ("吴", "wu"),
    ("郑", "zheng"),
    ("冯", "feng"),
    ("许", "xu"),
    ("何", "he"),
    ("吕", "lv"),
];
const CN_GIVEN: &[(&str, &str)] = &[
    ("子", "zi"),
    ("豪", "hao"),
    ("婷", "ting"),
    ("俊", "jun"),
    ("宇", "yu"),
    ("欣", "xin"),
    ("浩", "hao2"),
    ("琪", "qi"),
    ("嘉", "jia"),
    ("怡", "yi"),
    ("博", "bo"),
    ("雪", "xue"),
    ("晨", "chen"),
    ("佳", "jia2"),
    ("凯", "kai"),
    ("雯", "wen"),
];

/// The `n`th filler member: (name, key name). Every fifth is Chinese. Names are distinct
/// for `n` below 12,000.
fn filler_member(n: usize) -> (String, String) {
    if n % 5 == 4 {
        let i = n / 5;
        let (s, sp) = CN_SURNAMES[i % CN_SURNAMES.len()];
        let rest = i / CN_SURNAMES.len();
        let (g1, p1) = CN_GIVEN[rest % CN_GIVEN.len()];
        let (g2, p2) = CN_GIVEN[(rest / CN_GIVEN.len()) % CN_GIVEN.len()];
        (format!("{s}{g1}{g2}"), format!("{sp}{p1}{p2}"))
    } else {
        let i = n - n / 5;
        let k = SYLLABLES.len();
        let name: String = [i % k, (i / k) % k, (i / k / k) % k]
            .iter()
            .map(|&s| SYLLABLES[s])
            .collect();
        let mut title = name.clone();
        if let Some(first) = title.get_mut(..1) {
            first.make_ascii_uppercase();
        }
        (title, name)
    }
}

/// `count` filler entries for the large set: members with made-up names saying the same
/// kinds of things as the group (every topic of theirs, slots drawn afresh), updated before
/// the group's own entries.
pub fn filler(count: usize) -> Vec<Fact> {
    let mut rng = Lcg::new(0x00f1_11e4);
    let mut out = Vec::with_capacity(count);
    let mut n = 0;
    while out.len() < count {
        let (name, key) = filler_member(n);
        n += 1;
        for topic in topics_of(&name) {
            if out.len() == count {
                break;
            }
            out.push(Fact {
                key: format!("{key}.{}", topic.key),
                content: member_fact(topic, &name, &mut rng),
                author: rng.below(MEMBERS),
                minute: -1 - out.len() as i64,
            });
        }
    }
    out
}

/// The synonym groups of the data, for [`parlor_testkit::FakeEmbeddings::start`]: each
/// group's words mean one thing in these entries and questions (English words as single
/// words, inflected forms the fake does not strip written out; Chinese terms match as
/// substrings).
pub fn synonyms() -> Vec<Vec<String>> {
    const GROUPS: &[&[&str]] = &[
        &["car", "automobile", "vehicle"],
        &["birthday", "born", "birth"],
        &["pet", "animal"],
        &["job", "work", "occupation", "profession", "employer"],
        &["allergic", "allergy", "allergies", "intolerant"],
        &["coffee", "drink", "espresso", "cafe"],
        &["timezone", "zone"],
        &["lives", "live", "living", "reside", "residing"],
        &["phone", "smartphone", "mobile"],
        &["hobby", "pastime", "enjoy"],
        &["sport", "athletic"],
        &["learning", "learn", "studying", "study", "studies"],
        &["language", "tongue"],
        &["favourite", "favorite"],
        &["band", "group"],
        &["commute", "commuting", "travel"],
        &["kid", "child", "children"],
        &["married", "marry", "spouse", "wedding"],
        &["holiday", "vacation", "vacationing"],
        &["booked", "booking", "reserved", "reserve", "reservation"],
        &["flight", "plane", "ticket"],
        &["hotel", "lodging", "staying", "stay"],
        &["dentist", "dental"],
        &["appointment", "checkup"],
        &["gym", "fitness", "exercise", "exercising"],
        &["diet", "food", "eat", "dieting"],
        &["shoe", "footwear"],
        &["desk", "workstation"],
        &["sits", "sitting", "sit"],
        &["moved", "move", "relocated"],
        &["neighbourhood", "district"],
        &["grows", "grow", "growing", "cultivate", "cultivating"],
        &["garden", "yard", "plants"],
        &["reading", "read", "novel"],
        &["film", "movie"],
        &["game", "video", "console"],
        &["played", "playing", "plays", "play"],
        &["laptop", "computer"],
        &["hometown", "city", "raised", "grew"],
        &["standup", "stand", "scrum"],
        &["offsite", "retreat"],
        &["wifi", "wireless", "internet"],
        &["deadline", "due"],
        &["budget", "money", "allowance"],
        &["owns", "leads"],
        &["lunch", "eat"],
        &["生日", "出生"],
        &["汽车", "车子"],
        &["机票", "航班"],
        &["订", "预订"],
        &["爱好", "兴趣"],
        &["孩子", "小孩"],
        &["牙医", "看牙"],
        &["健身", "健身房"],
        &["酒店", "宾馆"],
        &["老家", "家乡"],
        &["宠物", "猫", "狗"],
        &["结婚", "纪念日"],
        &["读", "书"],
        &["电影", "片子"],
    ];
    GROUPS
        .iter()
        .map(|group| group.iter().map(|w| (*w).to_owned()).collect())
        .collect()
}
