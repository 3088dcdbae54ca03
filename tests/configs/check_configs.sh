#!/usr/bin/env bash
# Every file in configs/ loads with `kvctl --check-config` (run from the repository root, as the
# recipes' relative budget.profile paths expect); every recipe starts with "# Recipe:", points to
# docs/quality.md, says what the engine sends and is listed in configs/README.md; every shipped
# profile in configs/profiles/ loads as a budget.profile; and a recipe whose profile is missing is
# refused (so the profile load above is real).
# Usage: check_configs.sh KVCTL_BINARY REPO_ROOT
set -u
kvctl=$1
cd "$2" || exit 1
fail=0
note() { echo "FAIL $*"; fail=1; }
checked=0
for f in configs/*.toml; do
  checked=$((checked + 1))
  err=$("$kvctl" --check-config "$f" 2>&1 >/dev/null) || note "$f: kvctl --check-config: $err"
  case $(basename "$f") in
    default.toml | smollm2-135m.toml) continue ;;
  esac
  head -1 "$f" | grep -q '^# Recipe: ' || note "$f: the first line is not '# Recipe: <what it is for>'"
  grep -q 'docs/quality.md' "$f" || note "$f: no pointer to its measured quality in docs/quality.md"
  grep -q '^# The engine ' "$f" || note "$f: does not say what the engine must send ('# The engine ...')"
  grep -qF "\`$(basename "$f")\`" configs/README.md || note "$f: not listed in configs/README.md"
done
[ "$checked" -ge 7 ] || note "configs/: $checked files, expected at least 7"
profiles=0
for p in configs/profiles/*.toml; do
  profiles=$((profiles + 1))
  method=$(sed -n 's/^method = "\(.*\)"$/\1/p' "$p" | head -1)
  err=$("$kvctl" --check-config configs/lossless.toml --set budget.mode=quant-only \
    --set budget.avg_bits=4 --set "budget.profile=$p" --set "quant.method=$method" 2>&1 >/dev/null) ||
    note "$p: does not load as budget.profile: $err"
done
[ "$profiles" -ge 1 ] || note "configs/profiles/: no profile"
if "$kvctl" --check-config configs/joint-1of8.toml --set budget.profile=configs/profiles/missing.toml \
    >/dev/null 2>&1; then
  note "joint-1of8.toml with a missing profile was accepted: the profile is not loaded at check"
fi
[ $fail -eq 0 ] && echo "configs: $checked files and $profiles profiles ok"
exit $fail
