package io.pmemblk.pmem;

import org.junit.jupiter.params.ParameterizedTest;
import org.junit.jupiter.params.provider.EnumSource;

import java.lang.annotation.ElementType;
import java.lang.annotation.Retention;
import java.lang.annotation.RetentionPolicy;
import java.lang.annotation.Target;

import static org.junit.jupiter.api.Assumptions.assumeTrue;

/**
 * Runs the test once per mapper that maps the file itself, JAVA and LIBPMEM (AUTO only picks one of the two), each
 * run named after its mapper. The test takes the {@link PmemRegion.Mapper} and calls {@link Assume#available} before
 * it maps: where libpmem is not installed the LIBPMEM run is skipped, not failed.
 */
@Target(ElementType.METHOD)
@Retention(RetentionPolicy.RUNTIME)
@ParameterizedTest(name = "{0}")
@EnumSource(value = PmemRegion.Mapper.class, names = {"JAVA", "LIBPMEM"})
@interface EachMapper {
    /** An annotation cannot hold a method: the assumption that goes with it lives here. */
    final class Assume {
        private Assume() {
        }

        static void available(PmemRegion.Mapper mapper) {
            if (mapper == PmemRegion.Mapper.LIBPMEM) {
                assumeTrue(Libpmem.load().isPresent(), "libpmem not installed: " + Libpmem.unavailableReason());
            }
        }
    }
}
