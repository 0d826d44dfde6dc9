// Stand-in for Apple's <dispatch/dispatch.h> (see Foundation/Foundation.h here).
#pragma once

@protocol OS_dispatch_queue
@end
typedef id<OS_dispatch_queue> dispatch_queue_t;
typedef void (^dispatch_block_t)(void);
