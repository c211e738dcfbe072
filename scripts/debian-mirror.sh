# Sourced (not run) by scripts/fetch-kernel.sh and scripts/setup.sh: find_mirror prints
# the URI of the Debian archive this host's apt already uses, so that no script names a
# mirror itself.
#
# deb822 sources first (/etc/apt/sources.list.d/debian.sources), then the one-line
# format.  Only the main archive counts (not -security, not 3rd party).
find_mirror() {
    local f
    for f in /etc/apt/sources.list.d/debian.sources /etc/apt/sources.list.d/*.sources; do
        [ -f "$f" ] || continue
        awk '
            function flush() {
                if (uris != "" && suites ~ /(^| )(bookworm|trixie|forky|sid|unstable|testing|stable)( |$)/ && uris !~ /security/) {
                    split(uris, u, " "); print u[1]; found = 1; exit
                }
                uris = ""; suites = ""
            }
            /^[ \t]*#/ { next }
            /^[ \t]*$/ { flush(); next }
            tolower($1) == "uris:"   { $1 = ""; sub(/^ +/, ""); uris = $0 }
            tolower($1) == "suites:" { $1 = ""; sub(/^ +/, ""); suites = $0 }
            END { if (!found) flush() }
        ' "$f" | head -n1 | grep . && return 0
    done
    for f in /etc/apt/sources.list /etc/apt/sources.list.d/*.list; do
        [ -f "$f" ] || continue
        # deb [opts] URI SUITE COMPONENTS...
        sed -e 's/#.*//' -e 's/\[[^]]*\]//' "$f" | awk '
            $1 == "deb" && $2 !~ /security/ && $3 ~ /^(bookworm|trixie|forky|sid|unstable|testing|stable)(-updates)?$/ { print $2; exit }
        ' | grep . && return 0
    done
    return 1
}
