#!/usr/bin/env bash
# Mutation testing of the core (docs/testing.md, "Mutation score"): gremlins
# mutates one package's code at a time, runs that package's tests once per
# mutant, and the mutant is killed when a test fails (or times out). Prints
# one score line per package; the survivors are listed above it.
#
#   scripts/mutation.sh [bin]                  every measured package
#   MUTATION_PKGS="envelope ledger" scripts/mutation.sh
#   MUTATION_WORKERS=2 scripts/mutation.sh     mutants tested at once (default 1)
#
# Tests run against the real Postgres, like the rest of the suite.
#
#   scripts/mutation.sh one PKG FILE:LINE:COL MUTATOR [go test flags]
#
# tries one mutant, as gremlins names it, in a copy of the module: gremlins
# never runs the mutants of switch-case conditions (it calls them not
# covered: Go's coverage blocks hold case bodies, not case expressions), and
# a survivor is checked this way once its test is written.
set -euo pipefail
cd "$(dirname "$0")/.."

go=${GO:-go}

if [ "${1:-}" = one ]; then
	pkg=$2 pos=$3 mutator=$4
	shift 4
	IFS=: read -r file line col <<<"$pos"
	copy=$(mktemp -d -t promptline-mutant.XXXXXX)
	trap 'rm -rf "$copy"' EXIT
	tar --exclude=./.git --exclude=./bin --exclude=node_modules -cf - . | tar -C "$copy" -xf -
	# Replace the operator at the byte column, longest token first, as gremlins does.
	LC_ALL=C awk -v line="$line" -v col="$col" -v m="$mutator" '
		BEGIN {
			split("== != <= > >= < < >= > <= != ==", neg, " ")
			split("<= < >= > < <= > >=", bnd, " ")
			split("+ - - + * / / * % *", ari, " ")
			split("++ -- -- ++", inc, " ")
		}
		function swap(pairs, n,   i, t) {
			for (i = 1; i < n; i += 2) {
				t = pairs[i]
				if (substr($0, col, length(t)) == t && (length(t) == 2 || substr($0, col, 2) !~ /^(==|!=|<=|>=|\+\+|--)$/)) {
					$0 = substr($0, 1, col - 1) pairs[i + 1] substr($0, col + length(t)); done = 1; return
				}
			}
		}
		NR == line {
			if (m == "CONDITIONALS_NEGATION") swap(neg, 12)
			else if (m == "CONDITIONALS_BOUNDARY") swap(bnd, 8)
			else if (m == "ARITHMETIC_BASE") swap(ari, 10)
			else if (m == "INCREMENT_DECREMENT") swap(inc, 4)
			if (!done) { print "no " m " operator at " line ":" col > "/dev/stderr"; exit 2 }
			print "mutant: " $0 > "/dev/stderr"
		}
		{ print }
	' "$pkg/$file" >"$copy/$pkg/$file"
	if (cd "$copy" && $go test -count=1 -failfast "$@" "./$pkg"); then
		echo "LIVED $pkg $pos $mutator"
	else
		echo "KILLED (or not viable: see above) $pkg $pos $mutator"
	fi
	exit 0
fi
bin=$(mkdir -p "${1:-bin}" && cd "${1:-bin}" && pwd)
version=v0.6.0
gremlins=$bin/gremlins
if ! [ -x "$gremlins" ] || ! $go version -m "$gremlins" 2>/dev/null | grep -q "mod.*github.com/go-gremlins/gremlins.*$version"; then
	echo "installing gremlins $version into $bin"
	GOBIN=$bin $go install "github.com/go-gremlins/gremlins/cmd/gremlins@$version"
fi

# The measured code of each package. admission: the admitter and its
# group; executor: the executor; the Kafka plumbing (pipeline), the turn
# loop's helpers and the providers are not measured.
pkgs=${MUTATION_PKGS:-envelope ledger recovery outbox admission executor}
declare -A exclude=(
	[admission]='admission/admit_reply'
	[executor]='executor/(continuation|local_wakes|permission|promotion|queued|step|tool_call|transcript|turn)'
)

# Survivors that no test can kill: the mutant behaves like the code
# (docs/testing.md says why for each). "package file:line:column MUTATOR".
# A change to the file moves them; a moved one shows up as lived again.
equivalent=$(
	cat <<-'EOF'
		envelope envelope.go:51:67 ARITHMETIC_BASE
		envelope envelope.go:170:9 CONDITIONALS_BOUNDARY
		envelope envelope.go:345:7 ARITHMETIC_BASE
		envelope envelope.go:345:10 CONDITIONALS_BOUNDARY
		envelope envelope.go:390:12 CONDITIONALS_BOUNDARY
		ledger pipelined.go:237:51 CONDITIONALS_NEGATION
		ledger retry.go:125:11 CONDITIONALS_BOUNDARY
		outbox relay.go:468:15 CONDITIONALS_BOUNDARY
		outbox relay.go:484:17 CONDITIONALS_BOUNDARY
		recovery rate.go:56:24 ARITHMETIC_BASE
		recovery rate.go:111:13 CONDITIONALS_BOUNDARY
	EOF
)

out=$(mktemp -d -t promptline-mutation.XXXXXX)
summary=()
for pkg in $pkgs; do
	# A mutant's timeout is the coverage run's time by this coefficient;
	# envelope's tests take milliseconds and its runs are all compilation.
	coefficient=${MUTATION_TIMEOUT_COEFFICIENT:-$([ "$pkg" = envelope ] && echo 10 || echo 5)}
	args=(unleash --workers "${MUTATION_WORKERS:-1}" --timeout-coefficient "$coefficient" -S ltc)
	if [ -n "${exclude[$pkg]:-}" ]; then
		args+=(-E "${exclude[$pkg]}")
	fi
	echo "== $pkg"
	start=$(date +%s)
	# -count=1: a cached coverage run would time the tests at ~0 s, and
	# gremlins derives each mutant's timeout from that time.
	GOFLAGS=-count=1 "$gremlins" "${args[@]}" "./$pkg" | tee "$out/$pkg.txt" | grep -E 'LIVED|TIMED OUT|NOT COVERED' || true
	secs=$(($(date +%s) - start))
	read -r killed lived uncovered < <(sed -nE 's/^Killed: ([0-9]+), Lived: ([0-9]+), Not covered: ([0-9]+).*/\1 \2 \3/p' "$out/$pkg.txt")
	timedout=$(sed -nE 's/^Timed out: ([0-9]+).*/\1/p' "$out/$pkg.txt")
	if [ -z "${killed:-}" ] || [ -z "${timedout:-}" ]; then
		echo "mutation $pkg: gremlins did not finish (output in $out/$pkg.txt)"
		summary+=("mutation $pkg: no result")
		continue
	fi
	equiv=0
	while read -r where mutator; do
		if grep -qE "LIVED +$mutator at ${where//./\\.}\$" "$out/$pkg.txt"; then
			equiv=$((equiv + 1))
		fi
	done < <(awk -v p="$pkg" '$1 == p { print $2, $3 }' <<<"$equivalent")
	dead=$((killed + timedout))
	run=$((dead + lived - equiv))
	all=$((run + uncovered))
	line=$(awk -v p="$pkg" -v d="$dead" -v r="$run" -v a="$all" -v l="$((lived - equiv))" -v e="$equiv" -v u="$uncovered" -v s="$secs" 'BEGIN {
		printf "mutation %s: %.1f%% killed (%d of %d run, %d lived, %d equivalent set aside); %d not covered (%.1f%% of all %d); %dm%02ds",
			p, r ? 100 * d / r : 100, d, r, l, e, u, a ? 100 * d / a : 100, a, s / 60, s % 60 }')
	echo "$line"
	summary+=("$line")
done
echo
printf '%s\n' "${summary[@]}"
