//! What a model's tokens cost: `[llm.prices]` in the config, per model, in US dollars per
//! million tokens. Costs are kept as whole nanodollars (10⁻⁹ USD) so that sums over a
//! chat's day, a member's day and `/metrics` add up exactly; a cheap model's cached token
//! costs a few nanodollars, more than a microdollar would resolve.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use super::Usage;

/// One model's prices, in USD per million tokens.
#[derive(Debug, Clone, Copy, PartialEq, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Price {
    /// Prompt tokens not served from or written to a cache.
    pub input: f64,
    /// Generated tokens.
    pub output: f64,
    /// Prompt tokens read from the provider's cache; the input price when not given (so a
    /// cost is never under-reported).
    #[serde(default)]
    pub cache_read: Option<f64>,
    /// Prompt tokens written to the provider's cache (Anthropic bills them above input);
    /// the input price when not given.
    #[serde(default)]
    pub cache_write: Option<f64>,
}

impl Price {
    /// Whether every price is a finite number of dollars, zero or more.
    pub fn is_valid(&self) -> bool {
        [
            Some(self.input),
            Some(self.output),
            self.cache_read,
            self.cache_write,
        ]
        .into_iter()
        .flatten()
        .all(|p| p.is_finite() && p >= 0.0)
    }

    /// The cost of `usage` in nanodollars. `prompt_tokens` includes cache reads and writes
    /// (the [`Usage`] convention), so they are taken out of the tokens billed as input.
    pub fn cost_nanos(&self, usage: &Usage) -> u64 {
        let plain = usage
            .prompt_tokens
            .saturating_sub(usage.cache_read_tokens + usage.cache_write_tokens);
        nanos(plain, self.input)
            + nanos(usage.completion_tokens, self.output)
            + nanos(
                usage.cache_read_tokens,
                self.cache_read.unwrap_or(self.input),
            )
            + nanos(
                usage.cache_write_tokens,
                self.cache_write.unwrap_or(self.input),
            )
    }
}

/// `tokens` at `per_million` USD per million tokens, in nanodollars (1 USD per million
/// tokens is 1,000 nanodollars per token).
fn nanos(tokens: u64, per_million: f64) -> u64 {
    let cost = (tokens as f64 * per_million * 1_000.0).round();
    // `as` saturates: a NaN (refused by `is_valid`) would be 0, an absurd price u64::MAX.
    cost as u64
}

/// Prices by model name, as configured.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(transparent)]
pub struct Prices(pub BTreeMap<String, Price>);

impl Prices {
    /// The cost of `usage` by `model`, in nanodollars; `None` when the model has no price
    /// (the tokens are still counted, the cost is unknown).
    pub fn cost_nanos(&self, model: &str, usage: &Usage) -> Option<u64> {
        self.0.get(model).map(|price| price.cost_nanos(usage))
    }

    /// Whether no model has a price.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}

/// Tokens by the model that spent them: what a turn, a summary or a sub-agent run used, so
/// that each model's tokens are priced at its own price (a failover moves a turn's later
/// requests to another model).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Spend {
    by_model: Vec<(String, Usage)>,
}

impl Spend {
    /// Adds `usage` of one request answered by `model`.
    pub fn add(&mut self, model: &str, usage: &Usage) {
        match self.by_model.iter_mut().find(|(m, _)| m == model) {
            Some((_, sum)) => sum.add(usage),
            None => self.by_model.push((model.to_owned(), usage.clone())),
        }
    }

    /// Adds everything `other` spent.
    pub fn merge(&mut self, other: &Spend) {
        for (model, usage) in &other.by_model {
            self.add(model, usage);
        }
    }

    /// Each model with its tokens, in the order first used.
    pub fn by_model(&self) -> &[(String, Usage)] {
        &self.by_model
    }

    /// Every model's tokens together.
    pub fn total(&self) -> Usage {
        let mut total = Usage::default();
        for (_, usage) in &self.by_model {
            total.add(usage);
        }
        total
    }

    /// Whether nothing was spent.
    pub fn is_empty(&self) -> bool {
        self.by_model.is_empty()
    }

    /// The cost at `prices`, in nanodollars; a model without a price adds nothing.
    pub fn cost_nanos(&self, prices: &Prices) -> u64 {
        self.by_model
            .iter()
            .filter_map(|(model, usage)| prices.cost_nanos(model, usage))
            .sum()
    }
}

/// Nanodollars as dollars for people: `$1.23`, `$0.0123`, and six digits below a cent so
/// that a small cost does not read as zero.
pub fn dollars(nanos: u64) -> String {
    let usd = nanos as f64 / 1e9;
    if nanos == 0 {
        "$0".to_owned()
    } else if usd >= 1.0 {
        format!("${usd:.2}")
    } else if usd >= 0.01 {
        format!("${usd:.4}")
    } else {
        format!("${usd:.6}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn usage(prompt: u64, completion: u64, read: u64, write: u64) -> Usage {
        Usage {
            prompt_tokens: prompt,
            completion_tokens: completion,
            total_tokens: prompt + completion,
            cache_read_tokens: read,
            cache_write_tokens: write,
        }
    }

    #[test]
    fn a_cost_bills_each_kind_of_token_at_its_price() {
        let price = Price {
            input: 3.0,
            output: 15.0,
            cache_read: Some(0.3),
            cache_write: Some(3.75),
        };
        // 1,000 plain input, 200 out, 8,000 read, 500 written.
        let cost = price.cost_nanos(&usage(9_500, 200, 8_000, 500));
        assert_eq!(
            cost,
            1_000 * 3_000 + 200 * 15_000 + 8_000 * 300 + 500 * 3_750
        );
        assert_eq!(dollars(cost), "$0.0103");
        assert_eq!(dollars(cost / 10), "$0.001027");
    }

    #[test]
    fn cache_prices_left_out_are_the_input_price() {
        let price = Price {
            input: 0.15,
            output: 0.6,
            ..Price::default()
        };
        assert_eq!(
            price.cost_nanos(&usage(1_000, 0, 600, 0)),
            price.cost_nanos(&usage(1_000, 0, 0, 0))
        );
        assert_eq!(price.cost_nanos(&usage(1_000, 0, 0, 0)), 150_000);
    }

    #[test]
    fn an_unpriced_model_has_no_cost_and_bad_prices_are_invalid() {
        let prices = Prices::default();
        assert_eq!(prices.cost_nanos("gpt-x", &usage(10, 10, 0, 0)), None);
        for bad in [f64::NAN, -1.0, f64::INFINITY] {
            let price = Price {
                input: bad,
                ..Price::default()
            };
            assert!(!price.is_valid());
        }
        assert_eq!(dollars(0), "$0");
        assert_eq!(dollars(1_234_000_000), "$1.23");
    }
}
