/* The examples' number parser: a whole decimal integer in [min, max]; anything else (atoi
 * would have read "abc" as 0) is refused with a message and exit status 2. Shared by
 * fabric_produce.c and fabric_consume.c. */
#ifndef FABRIC_EXAMPLES_INT_ARG_H
#define FABRIC_EXAMPLES_INT_ARG_H

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>

static inline long long int_arg(const char *prog, const char *flag, const char *text, long long min,
                                long long max) {
    char *end;
    errno = 0;
    long long v = strtoll(text, &end, 10);
    if (errno != 0 || end == text || *end != '\0' || v < min || v > max) {
        fprintf(stderr, "%s: %s wants an integer in [%lld, %lld], not \"%s\"\n", prog, flag, min,
                max, text);
        exit(2);
    }
    return v;
}

#endif
