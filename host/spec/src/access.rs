//! What an API key may do: each key has one [`Role`], and each operation needs an
//! [`Access`] the role grants. A pure rule, so the whole table is tested in one place.

use serde::{Deserialize, Serialize};

/// A key's role, fixed when the key is made.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Role {
    /// What an agent needs: list, describe and call the tenant's tools (not private ones).
    Agent,
    /// Also install, remove and roll back tools, read versions and the policy, set the
    /// tenant's configuration, and call private tools.
    Developer,
    /// Decides calls held for approval, and nothing else.
    Approver,
    /// All of the above, and may pass the `data` context a tool trusts as the app's.
    Admin,
}

impl Role {
    /// Keys made before roles existed could install and call: they read as developers.
    pub fn stored_before_roles() -> Role {
        Role::Developer
    }

    /// The role's name, as `--role` and the API spell it.
    pub fn name(self) -> &'static str {
        match self {
            Role::Agent => "agent",
            Role::Developer => "developer",
            Role::Approver => "approver",
            Role::Admin => "admin",
        }
    }

    /// Whether a key of this role may do `access`.
    pub fn may(self, access: Access) -> bool {
        use Role::*;
        match access {
            Access::Read => true,
            Access::Call => self != Approver,
            Access::CallPrivate | Access::Manage => matches!(self, Developer | Admin),
            Access::Decide => matches!(self, Approver | Admin),
            Access::SetData => self == Admin,
        }
    }
}

impl std::str::FromStr for Role {
    type Err = String;

    fn from_str(text: &str) -> Result<Self, String> {
        [Role::Agent, Role::Developer, Role::Approver, Role::Admin]
            .into_iter()
            .find(|role| role.name() == text)
            .ok_or_else(|| format!("no role `{text}`: agent, developer, approver or admin"))
    }
}

/// What an operation needs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Access {
    /// List, describe, export.
    Read,
    /// Call a tool an agent sees, over REST or MCP.
    Call,
    /// Call a tool marked `private`.
    CallPrivate,
    /// Install, remove, roll back; read versions and the policy.
    Manage,
    /// Approve or reject held calls, and list them.
    Decide,
    /// Pass a call's `data` context.
    SetData,
}

impl Access {
    /// Every access, in declaration order.
    pub const ALL: [Access; 6] = [
        Access::Read,
        Access::Call,
        Access::CallPrivate,
        Access::Manage,
        Access::Decide,
        Access::SetData,
    ];

    /// Its name in the API (`GET /v1/whoami`).
    pub fn name(self) -> &'static str {
        match self {
            Access::Read => "read",
            Access::Call => "call",
            Access::CallPrivate => "call_private",
            Access::Manage => "manage",
            Access::Decide => "decide",
            Access::SetData => "set_data",
        }
    }

    /// For error messages: "may not {what}".
    pub fn what(self) -> &'static str {
        match self {
            Access::Read => "read the tool list",
            Access::Call => "call tools",
            Access::CallPrivate => "call private tools",
            Access::Manage => "install, remove or roll back tools",
            Access::Decide => "decide calls held for approval",
            Access::SetData => "pass a call's `data` context",
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_role_may_do_exactly_its_part() {
        use Access::*;
        let table = [
            (Role::Agent, [true, true, false, false, false, false]),
            (Role::Developer, [true, true, true, true, false, false]),
            (Role::Approver, [true, false, false, false, true, false]),
            (Role::Admin, [true, true, true, true, true, true]),
        ];
        for (role, allowed) in table {
            let got = [Read, Call, CallPrivate, Manage, Decide, SetData].map(|a| role.may(a));
            assert_eq!(got, allowed, "{role:?}");
            assert_eq!(role.name().parse::<Role>(), Ok(role));
        }
        assert!("root".parse::<Role>().is_err());
    }
}
