package io.pmemblk.nbd;

import io.pmemblk.posix.Errno;
import io.pmemblk.queueing.Status;
import org.junit.jupiter.api.Test;

import java.lang.reflect.Field;
import java.lang.reflect.Modifier;

import static org.assertj.core.api.Assertions.assertThat;

/**
 * The block layer's completion codes go on the wire as NBD errors and, negated, as ublk results: each must be the
 * Linux errno of its name. The block layer is pure Java and does not see {@link Errno}; this test holds them equal.
 */
class StatusIsErrnoTest {
    @Test
    void everyStatusIsTheErrnoOfItsName() throws Exception {
        int checked = 0;
        for (Field f : Status.class.getFields()) {
            if (!Modifier.isStatic(f.getModifiers()) || f.getType() != int.class || f.getName().equals("OK")) {
                continue;
            }
            Field errno = Errno.class.getField(f.getName()); // NoSuchFieldException: a status Errno does not name
            assertThat(f.getInt(null)).as(f.getName()).isEqualTo(errno.getInt(null));
            assertThat(Errno.name(f.getInt(null))).as(f.getName()).isIn(f.getName(), "EOPNOTSUPP");
            checked++;
        }
        assertThat(checked).as("statuses checked").isGreaterThanOrEqualTo(8);
    }
}
